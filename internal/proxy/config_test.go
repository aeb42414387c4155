package proxy

import (
	"strings"
	"testing"
)

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"services:\n  - name: a\n    listen: 10.0.0.1:80\n    backend: [10.0.0.2:80]\n", "p.yaml:4: service: unknown key \"backend\""},
		{"services:\n  - name: a\n    listen: 10.0.0.1:80\n    backends: [10.0.0.2:70000]\n", "p.yaml:4: backends: \"10.0.0.2:70000\": port \"70000\" is not from 1 to 65535"},
		{"services:\n  - name: a\n    listen: 10.0.0.1:80\n    backends:\n      - \"[2001:db8::1]:80\"\n", "p.yaml:5: backends: [2001:db8::1]:80 is IPv6 and the service listens on IPv4"},
		{"services:\n  - name: a\n    listen: \"[::]:80\"\n    backends: [10.0.0.2:80]\n", "p.yaml:4: backends: 10.0.0.2:80 is IPv4 and the service listens on IPv6"},
		{"services:\n  - name: a\n    protocol: sctp\n    listen: 10.0.0.1:80\n    backends: [10.0.0.2:80]\n", "p.yaml:3: protocol: \"sctp\": tcp or udp"},
		{"services:\n  - name: a\n    listen: 10.0.0.1:80\n    backends: [10.0.0.2:80]\n  - name: a\n    listen: 10.0.0.1:81\n    backends: [10.0.0.2:80]\n", "p.yaml:5: name: service \"a\" is named twice"},
		{"table: 0\nservices: []\n", "p.yaml:1: table: \"0\""},
		{"services: []\n", "p.yaml:1: services: a list of at least one service"},
		{"services:\n  - name: a\n    listen: 10.0.0.1\n    backends: [10.0.0.2:80]\n", "p.yaml:3: listen: \"10.0.0.1\": want ADDRESS:PORT"},
	} {
		_, err := Parse("p.yaml", []byte(c.text))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.text, err, c.want)
		}
	}
	cfg, err := Parse("p.yaml", []byte("services:\n  - {name: d, protocol: udp, listen: \"[::1]:53\", backends: [\"[::2]:53\"], max_sessions: 5, idle_timeout: 5s}\n"))
	if err != nil || !cfg.Services[0].UDP || cfg.Services[0].MaxSessions != 5 || cfg.Table != DefaultTable {
		t.Errorf("%+v %v", cfg, err)
	}
}

// TestConfigSyntaxErrorLine: a YAML syntax error names the line it is on.
func TestConfigSyntaxErrorLine(t *testing.T) {
	_, err := Parse("p.yaml", []byte("services:\n  - name: a\n   listen: 10.0.0.1:80\n    backends: [10.0.0.2:80]\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "p.yaml:3: syntax:") {
		t.Errorf("%v, want p.yaml:3: syntax: …", err)
	}
}

// TestConfigReservedTables: the kernel's own tables are refused, with the
// line and field.
func TestConfigReservedTables(t *testing.T) {
	for _, table := range []string{"0", "253", "254", "255"} {
		_, err := Parse("p.yaml", []byte("table: "+table+"\nservices:\n  - {name: a, listen: \"10.0.0.1:80\", backends: [\"10.0.0.2:80\"]}\n"))
		if err == nil || !strings.Contains(err.Error(), "p.yaml:1: table: \""+table+"\"") || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("table %s: %v", table, err)
		}
	}
}
