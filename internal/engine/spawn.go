package engine

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// spawn starts this program again with args, in a session of its own so that
// killing the caller (or its terminal) does not stop it, on the firewall's
// roots and namespace. It logs to logName in the state root. The program
// must understand the global flags --pin-root, --state-root and --netns:
// the rampart binary does.
func (fw *Firewall) spawn(logName string, args ...string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(fw.stateRoot, logName), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args = append(args, "--pin-root", fw.pinRoot, "--state-root", fw.stateRoot)
	if fw.netns != "" {
		args = append(args, "--netns", fw.netns)
	}
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}
