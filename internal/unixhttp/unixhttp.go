// Package unixhttp is HTTP on a local unix socket that only root (and a
// group it names) can open: the API of rampart serve and the status of
// rampart proxy.
package unixhttp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Listen opens path for root alone (0600, its directory 0700 when Listen
// creates it). It replaces a stale socket (one nobody answers on: a killed
// process left it) and refuses anything else at path: a regular file, a
// directory, or a socket another process answers on. Closing the listener
// removes the socket if path still is the one it created.
func Listen(path string) (net.Listener, error) { return ListenGroup(path, -1) }

// ListenGroup is Listen for root and the group gid too: the socket is
// 0660 root:gid. A negative gid is Listen.
func ListenGroup(path string, gid int) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	mode := os.FileMode(0o600)
	if gid >= 0 {
		mode = 0o660
	}
	// The mode is set between bind(2) and listen(2): nobody can connect to
	// a socket that does not listen yet, so it is never reachable with the
	// umask's mode. A umask around bind would do the same but is
	// process-wide, and would change the files other goroutines create.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close() // FileListener holds a copy
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		// EADDRINUSE: another process created it since removeStale.
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	fi, err := os.Lstat(path)
	if err == nil && gid >= 0 {
		if err = os.Chown(path, -1, gid); errors.Is(err, os.ErrPermission) {
			err = fmt.Errorf("%w: to give the socket group %d the process must be in that group (systemd: SupplementaryGroups=) or have CAP_CHOWN", err, gid)
		}
	}
	if err == nil {
		err = os.Chmod(path, mode)
	}
	if err == nil {
		err = unix.Listen(fd, unix.SOMAXCONN)
	}
	var ln net.Listener
	if err == nil {
		ln, err = net.FileListener(f)
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return &listener{Listener: ln, path: path, created: fi}, nil
}

// removeStale clears path for a new socket: nothing there, or a socket
// that refuses connections (its process is gone) is removed. A socket that
// answers, or any other file, is refused: it is not this process's to take.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("socket %s: exists and is not a socket: remove it or choose another path", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("socket %s: another process answers on it (a running rampart?): stop it or choose another path", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("socket %s: cannot tell whether another process still uses it: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("socket %s: remove the stale socket: %w", path, err)
	}
	return nil
}

// listener removes its socket on Close, if path still names the file it
// bound (same device and inode): another process may have taken the path
// since, and its socket is not this one's to remove.
type listener struct {
	net.Listener
	path    string
	created os.FileInfo
	once    sync.Once
}

func (l *listener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() {
		if fi, statErr := os.Lstat(l.path); statErr == nil && os.SameFile(fi, l.created) {
			os.Remove(l.path)
		}
	})
	return err
}

// Client talks HTTP to the socket at path, whatever host a URL names.
func Client(path string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
}

// Peer is who holds the other end of a connection: the credentials its
// process had when it connected, as the kernel recorded them.
type Peer struct {
	PID      int32
	UID, GID uint32
	Groups   []uint32 // supplementary groups
}

// InGroup tells whether gid is the peer's primary or a supplementary group.
func (p Peer) InGroup(gid uint32) bool { return p.GID == gid || slices.Contains(p.Groups, gid) }

// PeerOf reads the credentials of a unix socket connection's peer
// (SO_PEERCRED and SO_PEERGROUPS).
func PeerOf(c net.Conn) (Peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Peer{}, fmt.Errorf("peer credentials: %T is not a unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, fmt.Errorf("peer credentials: %w", err)
	}
	var p Peer
	var opErr error
	err = raw.Control(func(fd uintptr) {
		var cred *unix.Ucred
		if cred, opErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); opErr != nil {
			return
		}
		p.PID, p.UID, p.GID = cred.Pid, cred.Uid, cred.Gid
		p.Groups, opErr = peerGroups(int(fd))
	})
	if err == nil {
		err = opErr
	}
	if err != nil {
		return Peer{}, fmt.Errorf("peer credentials: %w", err)
	}
	return p, nil
}

// peerGroups reads SO_PEERGROUPS, which x/sys/unix has no getter for: an
// array of gid_t, ERANGE with the size needed when the buffer is short.
func peerGroups(fd int) ([]uint32, error) {
	groups := make([]uint32, 64)
	for {
		size := uint32(len(groups) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&groups[0])), uintptr(unsafe.Pointer(&size)), 0)
		switch {
		case errno == unix.ERANGE && int(size/4) > len(groups):
			groups = make([]uint32, size/4)
		case errno == unix.ENOPROTOOPT: // before Linux 4.13: the primary group only
			return nil, nil
		case errno != 0:
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", errno)
		default:
			return groups[:size/4], nil
		}
	}
}

// DefaultPath is where a service named base of a network namespace ("":
// the host's) answers by default under stateRoot: one socket per
// namespace, so that a command reaches the service of the namespace it
// names and two namespaces' services never take each other's path.
func DefaultPath(stateRoot, base, netns string) string {
	if netns == "" {
		return filepath.Join(stateRoot, base+".sock")
	}
	return filepath.Join(stateRoot, base+"-netns-"+netns+".sock")
}
