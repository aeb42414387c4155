package engine

import (
	"path/filepath"

	"github.com/rampart-fw/rampart/internal/watchdog"
)

// spawn starts this program again with args, detached, on the firewall's
// roots and namespace. It logs to logName in the state root. The program
// must understand the global flags --pin-root, --state-root and --netns:
// the rampart binary does.
func (fw *Firewall) spawn(logName string, args ...string) error {
	args = append(args, "--pin-root", fw.pinRoot, "--state-root", fw.stateRoot)
	if fw.netns != "" {
		args = append(args, "--netns", fw.netns)
	}
	return watchdog.Start(filepath.Join(fw.stateRoot, logName), args...)
}
