// Package watchdog starts the detached processes that outlive the command
// starting them: chiefly the watchdogs that undo an unconfirmed change at
// its deadline. Such a change carries a random token and its watchdog is
// given the same one; at the deadline the watchdog undoes only a change
// that still carries it, so a confirmed or newer change stays.
package watchdog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// NewToken is a random token naming one change.
func NewToken() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Args are the flags a watchdog command takes (--token, --at) for the
// change with token, due at deadline.
func Args(token string, deadline time.Time) []string {
	return []string{"--token", token, "--at", deadline.UTC().Format(time.RFC3339Nano)}
}

// Wait sleeps until at, a watchdog's --at deadline (RFC 3339), or until ctx
// ends.
func Wait(ctx context.Context, at string) error {
	deadline, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return fmt.Errorf("--at: %w", err)
	}
	select {
	case <-time.After(time.Until(deadline)):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Start runs this program again with args, in a session of its own so that
// killing the caller (or its terminal) does not stop it. Its output is
// appended to logPath, or dropped when logPath is "".
func Start(logPath string, args ...string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, args...)
	if logPath != "" {
		logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		defer logf.Close()
		cmd.Stdout, cmd.Stderr = logf, logf
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}
