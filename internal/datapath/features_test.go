package datapath

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
)

// TestRequire: a missing feature is one line naming it and the kernel that
// has it; another probe failure says it was a probe.
func TestRequire(t *testing.T) {
	missing := &Feature{Name: "the frobnicate helper", Kernel: "9.1", probe: func() error { return ebpf.ErrNotSupported }}
	if err := Require(missing); err == nil || err.Error() != "this kernel lacks the frobnicate helper (Linux 9.1 or newer)" {
		t.Errorf("missing feature: %v", err)
	}
	broken := &Feature{Name: "x", Kernel: "1", probe: func() error { return errors.New("EPERM") }}
	if err := Require(broken); err == nil || err.Error() != "probe for x: EPERM" {
		t.Errorf("failing probe: %v", err)
	}
}
