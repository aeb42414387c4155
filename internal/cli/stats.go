package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/rampart-fw/rampart/internal/engine"
	"github.com/rampart-fw/rampart/internal/stats"
)

func statsCmd(g *globals) *cobra.Command {
	var (
		watch    bool
		interval time.Duration
	)
	c := &cobra.Command{
		Use:   "stats [--watch]",
		Short: "Per-rule packet and byte counters; --watch adds live rates",
		Long: `stats prints the counters of every rule, of the default action, of frames
whose verdict hung on fields they lack (unparsed), of frames whose IP header
is cut or invalid (malformed) and of frames that are not IP. With --watch it
refreshes every --interval and shows rates per second; with --json it prints
one JSON object per refresh.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if watch && interval <= 0 {
				return fmt.Errorf("--interval %s: give a positive refresh interval, e.g. --interval 1s", interval)
			}
			fws, err := g.everywhere()
			if err != nil {
				return err
			}
			snap, err := take(fws)
			if err != nil {
				return err
			}
			if !watch {
				return g.printStats(&snap, false)
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-cmd.Context().Done():
					return nil
				case <-tick.C:
				}
				next, err := take(fws)
				if err != nil {
					return err
				}
				stats.Rates(&snap, &next)
				snap = next
				if err := g.printStats(&snap, true); err != nil {
					return err
				}
			}
		},
	}
	c.Flags().BoolVarP(&watch, "watch", "w", false, "refresh and show rates until interrupted")
	c.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval with --watch")
	return c
}

func (g *globals) printStats(s *stats.Snapshot, rates bool) error {
	if g.json {
		if rates { // one object per line, for streaming
			return json.NewEncoder(g.env.Stdout).Encode(s)
		}
		return g.printJSON(s)
	}
	header := []string{"IFACE", "DIR", "RULE", "ACTION", "PACKETS", "BYTES"}
	if rates {
		header = append(header, "PPS", "BIT/S")
		if g.interactive() {
			fmt.Fprint(g.env.Stdout, "\033[H\033[2J")
		}
		fmt.Fprintln(g.env.Stdout, s.Time.Format(time.TimeOnly))
	}
	// Limit and syncookie rules say what they did besides matching.
	flood := slices.ContainsFunc(s.Rows, func(r stats.Row) bool { return r.Action == "limit" || r.Action == "syncookie" })
	if flood {
		header = append(header, "OVER LIMIT", "COOKIES SENT/OK/BAD")
	}
	rows := [][]string{header}
	for _, r := range s.Rows {
		row := []string{r.Iface + inNetns(r.Netns), r.Direction, r.Name, r.Action, strconv.FormatUint(r.Packets, 10), strconv.FormatUint(r.Bytes, 10)}
		if rates {
			row = append(row, strconv.FormatFloat(r.PPS, 'f', 0, 64), humanBits(r.BPS))
		}
		if flood {
			over, cookies := "-", "-"
			switch r.Action {
			case "limit":
				over = strconv.FormatUint(r.Over, 10)
			case "syncookie":
				cookies = fmt.Sprintf("%d/%d/%d", r.CookiesSent, r.CookiesOK, r.CookiesBad)
			}
			row = append(row, over, cookies)
		}
		rows = append(rows, row)
	}
	g.table(rows)
	return nil
}

func humanBits(b float64) string {
	for _, u := range []string{"", "k", "M", "G"} {
		if b < 1000 {
			return strconv.FormatFloat(b, 'f', 1, 64) + u
		}
		b /= 1000
	}
	return strconv.FormatFloat(b, 'f', 1, 64) + "T"
}

// take reads the counters of every firewall into one snapshot.
func take(fws []*engine.Firewall) (stats.Snapshot, error) {
	all := stats.Snapshot{Time: time.Now(), Rows: []stats.Row{}}
	for _, fw := range fws {
		s, err := fw.Stats()
		if err != nil {
			return all, err
		}
		all.Rows = append(all.Rows, s.Rows...)
	}
	return all, nil
}
