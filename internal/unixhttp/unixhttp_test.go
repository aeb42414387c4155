package unixhttp

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func answers(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// serveAccept accepts and closes connections until the listener closes.
func serveAccept(ln net.Listener) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

func TestListenRefusesRegularFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	os.WriteFile(path, []byte("precious\n"), 0o644)
	ln, err := Listen(path)
	if err == nil {
		ln.Close()
		t.Fatal("Listen took the path of a regular file")
	}
	if !strings.Contains(err.Error(), "not a socket") || !strings.Contains(err.Error(), path) {
		t.Errorf("error %q: want the path and that it is not a socket", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "precious\n" {
		t.Errorf("the regular file now holds %q", b)
	}
}

func TestListenRefusesLiveSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	first, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	serveAccept(first)
	second, err := Listen(path)
	if err == nil {
		second.Close()
		t.Fatal("a second Listen took a socket another listener answers on")
	}
	if !strings.Contains(err.Error(), "answers") {
		t.Errorf("error %q: want that a process answers there", err)
	}
	if !answers(path) {
		t.Error("after a second Listen the first listener no longer answers")
	}
}

func TestListenReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false) // as a killed process leaves it
	stale.Close()
	ln, err := Listen(path)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	defer ln.Close()
	serveAccept(ln)
	if !answers(path) {
		t.Error("the new socket does not answer")
	}
}

func TestCloseRemovesOnlyItsSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("after Close the socket is still there: %v", err)
	}
	// Another process's file at the path when the listener closes: kept.
	ln, err = Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(path)
	os.WriteFile(path, []byte("other\n"), 0o644)
	ln.Close()
	if b, _ := os.ReadFile(path); string(b) != "other\n" {
		t.Errorf("Close removed a file it did not create: the path holds %q", b)
	}
}

func TestListenMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "api.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if fi, _ := os.Lstat(path); fi == nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Dir(path)); fi == nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %v, want 0700", fi.Mode())
	}
}

func TestListenGroupAndPeer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	gid := os.Getgid()
	ln, err := ListenGroup(path, gid)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if fi, _ := os.Lstat(path); fi == nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want 0660", fi.Mode())
	}
	got := make(chan Peer, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
			got <- Peer{}
			return
		}
		defer c.Close()
		p, err := PeerOf(c)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := <-got
	groups, _ := os.Getgroups()
	if p.UID != uint32(os.Getuid()) || p.GID != uint32(gid) || int(p.PID) != os.Getpid() || len(p.Groups) != len(groups) {
		t.Errorf("peer %+v, want uid %d gid %d pid %d groups %v", p, os.Getuid(), gid, os.Getpid(), groups)
	}
	if !p.InGroup(uint32(gid)) {
		t.Errorf("peer %+v not in its own primary group", p)
	}
}
