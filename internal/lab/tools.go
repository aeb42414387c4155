package lab

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Run runs a command and returns its output in the error when it fails.
func Run(args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// InNs runs a command in a named network namespace.
func InNs(ns string, args ...string) error {
	return Run(append([]string{"ip", "netns", "exec", ns}, args...)...)
}

// Output runs a command and returns its standard output.
func Output(args ...string) ([]byte, error) {
	var errb bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out, nil
}

// RestoreIn feeds script to a command run in ns (iptables-restore, ipset
// restore, nft -f -).
func RestoreIn(ns, script string, args ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, firstLine(out))
	}
	return nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

// The names of what the studies create in their namespaces: an nftables
// table and an ipset set.
const (
	NftTable = "rampart_lab"
	IpsetSet = "rampart_lab_flood"
)

// packages name the Debian package of each tool a study needs.
var packages = map[string]string{
	"iptables": "iptables", "ip6tables": "iptables", "iptables-legacy": "iptables", "ip6tables-legacy": "iptables",
	"nft": "nftables", "tc": "iproute2", "ip": "iproute2", "ethtool": "ethtool", "ipset": "ipset",
	"iperf3": "iperf3", "ping": "iputils-ping", "taskset": "util-linux", "sysctl": "procps",
	"xdp-filter": "xdp-tools", "nsenter": "util-linux",
}

// MissingTool names the first of tools that is not installed, with the
// package to install; "" when all are.
func MissingTool(tools []string) string {
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Sprintf("%s not found: install the Debian package %s (apt-get install %s)", t, packages[t], packages[t])
		}
	}
	return ""
}

// IptablesFor picks the study's iptables: the legacy (xtables) one when it
// is installed, else whatever iptables is.
func IptablesFor(family int) string {
	name := "iptables"
	if family == 6 {
		name = "ip6tables"
	}
	if _, err := exec.LookPath(name + "-legacy"); err == nil {
		return name + "-legacy"
	}
	return name
}

// IptablesCounter reads, in ns, the packet counter of the first rule in
// table/chain whose target is target.
func IptablesCounter(ns, ipt, table, chain, target string) func() (uint64, error) {
	return func() (uint64, error) {
		out, err := Output("ip", "netns", "exec", ns, ipt, "-w", "-t", table, "-L", chain, "-v", "-x", "-n")
		if err != nil {
			return 0, err
		}
		return parseIptablesCount(string(out), target)
	}
}

// parseIptablesCount finds the rule with the target in `iptables -L -v -x -n`
// output and returns its packet count.
func parseIptablesCount(out, target string) (uint64, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != target {
			continue
		}
		if n, err := strconv.ParseUint(f[0], 10, 64); err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("no %s rule in:\n%s", target, out)
}

// ParseIperf reads the received rate, in Gbit/s, from iperf3 -J.
func ParseIperf(out []byte) (float64, error) {
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return 0, fmt.Errorf("iperf3 -J: %w", err)
	}
	if res.Error != "" {
		return 0, errors.New("iperf3: " + res.Error)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9, nil
}
