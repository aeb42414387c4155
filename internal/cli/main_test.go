package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/rampart-fw/rampart/internal/cli"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestMain gives the package's commands roots of their own (through the
// environment, which the processes they start inherit), and lets this test
// binary act as rampart when re-executed: apply --confirm starts
// os.Executable() as its rollback watchdog, and tests run commands in a
// child process to kill them.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "rollback-watchdog" || os.Args[1] == "list-expire" || os.Getenv("RAMPART_TEST_AS_CLI") == "1") {
		cli.Main()
		os.Exit(0)
	}
	state, err := os.MkdirTemp("", "rampart-state-")
	if err != nil {
		panic(err)
	}
	pin := state + "/not-on-bpffs" // without root, privileged tests skip
	if os.Geteuid() == 0 {
		if pin, err = testutil.TempPinRoot(); err != nil {
			panic(err)
		}
	}
	os.Setenv("RAMPART_PIN_ROOT", pin)
	os.Setenv("RAMPART_STATE_ROOT", state)
	code := m.Run()
	os.RemoveAll(pin)
	os.RemoveAll(state)
	os.Exit(code)
}

// rampart runs one command in-process and returns its stdout and error.
func rampart(t testing.TB, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := cli.Run(context.Background(), cli.Env{Stdout: &out, Stderr: &errb}, args)
	return out.String(), err
}

// mustRampart fails the test when the command fails.
func mustRampart(t testing.TB, args ...string) string {
	t.Helper()
	out, err := rampart(t, args...)
	if err != nil {
		t.Fatalf("rampart %v: %v\n%s", args, err, out)
	}
	return out
}

// jsonOf runs a command with --json and decodes its output.
func jsonOf(t testing.TB, v any, args ...string) {
	t.Helper()
	out := mustRampart(t, append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("rampart %v --json: %v\n%s", args, err, out)
	}
}

func writeFile(t testing.TB, name, text string) string {
	t.Helper()
	p := t.TempDir() + "/" + name
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
