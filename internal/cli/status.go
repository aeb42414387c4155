package cli

import (
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/datapath"
)

type hookStatus struct {
	Iface           string     `json:"iface"`
	Netns           string     `json:"netns,omitempty"`
	Direction       string     `json:"direction"`
	Layer           string     `json:"layer"`
	Mode            string     `json:"mode"`
	Attached        bool       `json:"attached"`
	PolicyFile      string     `json:"policy_file"`
	PolicyHash      string     `json:"policy_hash"`
	AppliedAt       time.Time  `json:"applied_at"`
	Rules           int        `json:"rules"`
	Generation      int        `json:"generation"`
	ConfirmDeadline *time.Time `json:"confirm_deadline,omitempty"`
}

func statusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show where rampart is attached, at which layer, with which policy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			states, err := g.states()
			if err != nil {
				return err
			}
			out := []hookStatus{}
			for _, st := range states {
				hs := hookStatus{Iface: st.Hook.Iface, Netns: st.Hook.Netns, Direction: st.Hook.Direction(),
					Layer: layer(st.Mode), Mode: string(st.Mode), Attached: datapath.Attached(st.Hook),
					PolicyFile: st.PolicyFile, PolicyHash: st.PolicyHash, AppliedAt: st.AppliedAt,
					Rules: len(st.Rules), Generation: st.Generation}
				if st.Pending != nil {
					hs.ConfirmDeadline = &st.Pending.Deadline
				}
				out = append(out, hs)
			}
			if g.json {
				return g.printJSON(map[string]any{"hooks": out})
			}
			rows := [][]string{{"IFACE", "DIRECTION", "LAYER", "MODE", "RULES", "POLICY", "APPLIED", "STATE"}}
			for _, h := range out {
				state := "active"
				switch {
				case !h.Attached:
					state = "DETACHED (link pin missing)"
				case h.ConfirmDeadline != nil:
					state = "unconfirmed until " + h.ConfirmDeadline.Local().Format(time.TimeOnly)
				}
				rows = append(rows, []string{h.Iface + inNetns(h.Netns), h.Direction, h.Layer, h.Mode, strconv.Itoa(h.Rules),
					h.PolicyHash[:12], h.AppliedAt.Local().Format(time.DateTime), state})
			}
			g.table(rows)
			return nil
		},
	}
}

func layer(m datapath.Mode) string {
	if m == datapath.ModeTC {
		return "tc"
	}
	return "xdp"
}

// states lists the hooks of the --netns namespace (all without it).
func (g *globals) states() ([]*datapath.State, error) {
	unlock, err := g.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return datapath.States(g.netns, g.netns == "")
}
