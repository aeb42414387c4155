package cli_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"

	"github.com/rampart-fw/rampart/internal/netns"
	"github.com/rampart-fw/rampart/internal/testutil"
)

func TestCheck(t *testing.T) {
	pol := writeFile(t, "p.yaml", "lists:\n  b: {prefixes: [10.0.0.0/8, 10.1.0.0/16, 10.2.3.4, \"2001:db8::/32\"]}\nrules:\n  - {name: a, src: b, action: drop}\n")
	var res struct {
		Valid          bool
		Rules, Entries int
		Split          int `json:"v4_split_blocks"`
		V6             int `json:"v6_prefixes"`
	}
	jsonOf(t, &res, "check", "-f", pol)
	// The /16 and the /32 lie inside the /8: no block is split.
	if !res.Valid || res.Rules != 1 || res.Entries != 4 || res.Split != 0 || res.V6 != 1 {
		t.Errorf("check: %+v", res)
	}
	// --lenient skips bad list lines and counts them; without it they fail.
	list := writeFile(t, "l.txt", "10.0.0.1\nnonsense\n10.0.0.0/40\n10.0.0.2\n")
	lenient := writeFile(t, "lenient.yaml", fmt.Sprintf("lists:\n  l: {files: [%s]}\nrules:\n  - {name: a, src: l, action: drop}\n", list))
	if _, err := rampart(t, "check", "-f", lenient); err == nil || !strings.Contains(err.Error(), "l.txt:2:") || !strings.Contains(err.Error(), "--lenient") {
		t.Errorf("check of a list with bad lines: %v", err)
	}
	var lres struct {
		Entries int
		Skipped int `json:"skipped_lines"`
	}
	jsonOf(t, &lres, "check", "-f", lenient, "--lenient")
	if lres.Entries != 2 || lres.Skipped != 2 {
		t.Errorf("check --lenient: %+v", lres)
	}
	bad := writeFile(t, "bad.yaml", "rules:\n  - {name: a, proto: udp, dport: 70000, action: drop}\n")
	_, err := rampart(t, "check", "-f", bad)
	if err == nil || !strings.Contains(err.Error(), "bad.yaml:2: dport:") {
		t.Errorf("check of a bad policy: %v", err)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"apply", "--iface", "lo"}, "--file/-f is required"},
		{[]string{"apply", "-f", "x.yaml"}, "--iface is required"},
		{[]string{"apply", "-f", "x.yaml", "--iface", "lo", "--mode", "fast"}, `--mode "fast"`},
		{[]string{"apply", "-f", "x.yaml", "--iface", "lo", "--mode", "xdp-native", "--egress"}, "XDP sees only incoming"},
		{[]string{"detach"}, "--iface is required"},
		{[]string{"apply", "-f", "/nonexistent.yaml", "--iface", "lo"}, "no such file"},
		{[]string{"lab", "drop", "--family", "5"}, `--family "5"`},
		{[]string{"lab", "drop", "--layers", "xdp,iptables-raw"}, `unknown layer "xdp": choose from app,`},
		{[]string{"lab", "drop", "--src6", "fd00::/80"}, "sources are /64s"},
		{[]string{"lab", "drop", "--src4", "192.0.2.0/24"}, "fewer than 1000000 sources"},
		{[]string{"lab", "flood", "--floods", "syn,icmp"}, `--floods: unknown flood "icmp": choose from syn, udp, sources`},
		{[]string{"lab", "flood", "--defences", "fail2ban"}, `--defences: unknown defence "fail2ban": choose from none,`},
		{[]string{"lab", "flood", "--family", "7"}, `--family "7"`},
		{[]string{"lab", "flood", "--tcp-rate", "0"}, "--tcp-rate and --udp-rate must be at least 1"},
		{[]string{"bench", "rules", "--family", "5"}, "--family 5"},
		{[]string{"bench", "apply", "--mix", "feed", "--sizes", "10000,200000"}, "--sizes 200000: the feed is a policy of that many rules, at most 131072"},
		{[]string{"lab", "egress", "--methods", "none,pf"}, `--methods: unknown method "pf": choose from none, iptables,`},
		{[]string{"lab", "egress", "--sizes", "10,0"}, "--sizes: 0: a size is 1 to 100000000 prefixes"},
		{[]string{"lab", "egress", "--sizes", "ten"}, `--sizes "ten"`},
		{[]string{"lab", "egress", "--destinations", "all"}, `--destinations "all": many or one`},
		{[]string{"tune", "tcp"}, "--rtt is required"},
		{[]string{"tune", "tcp", "--rtt", "10ms", "--apply"}, "--apply needs --bandwidth"},
		{[]string{"tune", "tcp", "--revert", "--root", "/nonexistent"}, "nothing to revert"},
		{[]string{"tune", "tcp", "--rtt", "10ms", "--bandwidth", "fast"}, `--bandwidth "fast": give a rate such as 1Gbit`},
		{[]string{"tune", "tcp", "--rtt", "10ms", "--root", "/nonexistent"}, "read the TCP settings: open /nonexistent/proc/sys/net/ipv4/tcp_rmem"},
		{[]string{"diagnose", "--duration", "0s"}, "--duration must be positive"},
		{[]string{"diagnose", "--iface", "nosuch0", "--duration", "10ms"}, `no interface "nosuch0"`},
		{[]string{"diagnose", "--netns", "nosuch-ns"}, `network namespace "nosuch-ns"`},
	} {
		_, err := rampart(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rampart %v: error %v, want %q", c.args, err, c.want)
		}
	}
}

// TestBadInputChangesNothing: a rejected apply leaves the running policy.
func TestBadInputChangesNothing(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	good := writeFile(t, "good.yaml", "rules:\n  - {name: a, proto: udp, dport: 9000, action: drop}\n")
	mustRampart(t, "apply", "-f", good, "--netns", p.NsB, "--iface", p.IfB)
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	before := hookStatus(t, p.NsB)
	listOf := func(content string) string { return writeFile(t, "list-"+fmt.Sprint(len(content)), content) }
	withList := func(content string) string {
		return fmt.Sprintf("lists:\n  l: {files: [%s]}\nrules:\n  - {name: a, src: l, action: drop}\n", listOf(content))
	}

	for _, c := range []struct {
		name, yaml string
		args       []string
		want       string
	}{
		{"unknown key", "rules:\n  - {name: a, action: drop, colour: red}\n", nil, "bad.yaml:2: rule: unknown key"},
		{"bad cidr", "rules:\n  - {name: a, src: 300.1.1.1, action: drop}\n", nil, "bad.yaml:2: src: bad address"},
		{"duplicate name", "rules:\n  - {name: a, action: drop}\n  - {name: a, action: drop}\n", nil, "bad.yaml:3: name"},
		{"missing list file", "lists:\n  l: {files: [/nonexistent/list]}\nrules: []\n", nil, "bad.yaml:2: lists.l.files"},
		{"missing interface", "rules: []\n", []string{"--iface", "nosuchif0"}, "--iface nosuchif0: no such interface"},
		{"second interface missing", "rules: []\n", []string{"--iface", p.IfB, "--iface", "nosuchif0"}, "--iface nosuchif0"},
		{"malformed list line", withList("192.0.2.1\n192.0.2.x\n"), nil, `:2: bad address "192.0.2.x"`},
		{"/33 in a list", withList("192.0.2.0/33\n"), nil, `:1: bad prefix "192.0.2.0/33"`},
		{"backwards range", withList("\n192.0.2.9-192.0.2.1\n"), nil, ":2: range 192.0.2.9-192.0.2.1: start is above end"},
		{"empty list file", withList(""), nil, "file is empty (0 bytes)"},
		{"binary list file", withList("\x7fELF\x00\x01"), nil, ":1: binary data"},
		{"ipv6 in an ipv4 list", fmt.Sprintf("lists:\n  l: {files: [%s], family: 4}\nrules:\n  - {name: a, src: l, action: drop}\n", listOf("192.0.2.1\n\n\n2001:db8::1\n")), nil, `:4: IPv6 entry "2001:db8::1" in an IPv4-only list`},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := writeFile(t, "bad.yaml", c.yaml)
			args := append([]string{"apply", "-f", bad, "--netns", p.NsB}, c.args...)
			if c.args == nil {
				args = append(args, "--iface", p.IfB)
			}
			_, err := rampart(t, args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			if after := hookStatus(t, p.NsB); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("host changed:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}

	// Tables over the memory allowed are refused before anything is made.
	t.Setenv("RAMPART_MAX_TABLE_BYTES", "100000")
	big := writeFile(t, "big.yaml", withList("0.0.0.0/0\n10.0.0.1\n"))
	if _, err := rampart(t, "apply", "-f", big, "--netns", p.NsB, "--iface", p.IfB); err == nil || !strings.Contains(err.Error(), "over RAMPART_MAX_TABLE_BYTES") {
		t.Fatalf("apply over the memory cap: %v", err)
	}
	if after := hookStatus(t, p.NsB); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("host changed by a refused apply:\nbefore %+v\nafter  %+v", before, after)
	}
}

// TestForeignXDP: another program's XDP is refused without --force.
func TestForeignXDP(t *testing.T) {
	testutil.Privileged(t)
	p := testutil.NewPair(t)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, 2, asm.DWord), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := netns.Run(p.NsB, func() error {
		l, err := netlink.LinkByName(p.IfB)
		if err != nil {
			return err
		}
		return netlink.LinkSetXdpFd(l, prog.FD())
	}); err != nil {
		t.Fatal(err)
	}
	pol := writeFile(t, "p.yaml", "rules: []\n")
	_, err = rampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB, "--mode", "xdp-native")
	if err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("apply over a foreign XDP program: %v, want a refusal naming --force", err)
	}
	if st := hookStatus(t, p.NsB); len(st.Hooks) != 0 {
		t.Fatalf("refused apply left state: %+v", st)
	}
	// auto runs at tc beside the other program (a libxdp dispatcher, say),
	// and says so; the other program stays.
	out := mustRampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB)
	if st := hookStatus(t, p.NsB); len(st.Hooks) != 1 || st.Hooks[0].Mode != "tc" || !strings.Contains(out, "another XDP program") {
		t.Fatalf("auto beside a foreign XDP program: %+v\n%s", st, out)
	}
	if link := testutil.Run(t, "ip", "-n", p.NsB, "link", "show", p.IfB); !strings.Contains(link, fmt.Sprintf("prog/xdp id %d", progID(t, prog))) {
		t.Fatalf("the other XDP program is gone: %s", link)
	}
	mustRampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB)
	mustRampart(t, "apply", "-f", pol, "--netns", p.NsB, "--iface", p.IfB, "--force")
	t.Cleanup(func() { rampart(t, "detach", "--netns", p.NsB, "--iface", p.IfB) })
	if st := hookStatus(t, p.NsB); len(st.Hooks) != 1 || !strings.HasPrefix(st.Hooks[0].Mode, "xdp") {
		t.Fatalf("after --force: %+v", st)
	}
}

func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// TestProxyInputErrors: bad proxy input names the flag, or the file and
// line, and starts nothing.
func TestProxyInputErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"proxy", "--listen", "192.0.2.1:99999", "--backend", "192.0.2.2:80"}, `--listen "192.0.2.1:99999": port "99999" is not from 1 to 65535`},
		{[]string{"proxy", "--listen", "192.0.2.1:80", "--backend", "[2001:db8::1]:80"}, "--backend [2001:db8::1]:80 is IPv6 and the service listens on IPv4"},
		{[]string{"proxy", "-f", writeFile(t, "p.yaml", "services:\n  - name: a\n    listen: 192.0.2.1:80\n    backends: [192.0.2.2:80]\n    colour: red\n")}, `p.yaml:5: service: unknown key "colour"`},
		{[]string{"proxy"}, "-f FILE, or --listen and --backend, is required"},
	} {
		if _, err := rampart(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rampart %v: %v, want %q", c.args, err, c.want)
		}
	}
}
