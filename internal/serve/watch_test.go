package serve

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// changed feeds the watcher's events for a while: whether one of them
// was a complete change.
func changed(t *testing.T, w *watcher, wait time.Duration) bool {
	t.Helper()
	any := false
	for end := time.After(wait); ; {
		select {
		case ev, ok := <-w.events:
			if !ok {
				t.Fatal("watcher closed")
			}
			any = w.handle(ev) || any
		case <-end:
			return any
		}
	}
}

func watch(t *testing.T, files ...string) *watcher {
	t.Helper()
	w, err := newWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	if failed := w.set(files); len(failed) > 0 {
		t.Fatal(failed)
	}
	return w
}

func TestResolveConfigMap(t *testing.T) {
	cfg := t.TempDir()
	os.Mkdir(filepath.Join(cfg, "..2024_a"), 0o755)
	os.WriteFile(filepath.Join(cfg, "..2024_a", "bl.txt"), nil, 0o644)
	os.Symlink("..2024_a", filepath.Join(cfg, "..data"))
	os.Symlink("..data/bl.txt", filepath.Join(cfg, "bl.txt"))
	got := resolve(filepath.Join(cfg, "bl.txt"))
	want := []string{filepath.Join(cfg, "bl.txt"), filepath.Join(cfg, "..data"), filepath.Join(cfg, "..2024_a", "bl.txt")}
	if !slices.Equal(got, want) {
		t.Errorf("resolve = %q, want %q", got, want)
	}
	plain := filepath.Join(cfg, "..2024_a", "bl.txt")
	if got := resolve(plain); !slices.Equal(got, []string{plain}) {
		t.Errorf("resolve of a plain file = %q", got)
	}
}

func TestWatcherWaitsForClose(t *testing.T) {
	dir := t.TempDir()
	list, other := filepath.Join(dir, "bl.txt"), filepath.Join(dir, "policy.yaml")
	os.WriteFile(list, []byte("192.0.2.0/24\n"), 0o644)
	os.WriteFile(other, nil, 0o644)
	w := watch(t, list, other)
	f, err := os.OpenFile(list, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("10.99.7.0/2")
	if changed(t, w, 200*time.Millisecond) {
		t.Error("a write that is not closed counts as a change")
	}
	os.WriteFile(other, []byte("x"), 0o644)
	if !changed(t, w, 200*time.Millisecond) || w.busy() != list {
		t.Errorf("another file written: want a change, and %s busy (busy: %q)", list, w.busy())
	}
	f.WriteString("4\n")
	f.Close()
	if !changed(t, w, 200*time.Millisecond) || w.busy() != "" {
		t.Errorf("closed: want a change and nothing busy (busy: %q)", w.busy())
	}
	// Written elsewhere and renamed into place: one complete change.
	os.WriteFile(list+".new", []byte("192.0.2.0/24\n"), 0o644)
	os.Rename(list+".new", list)
	if !changed(t, w, 200*time.Millisecond) || w.busy() != "" {
		t.Errorf("renamed into place: want a change and nothing busy (busy: %q)", w.busy())
	}
}

func TestWatcherFollowsLinks(t *testing.T) {
	cfg, other := t.TempDir(), t.TempDir()
	os.Mkdir(filepath.Join(cfg, "..a"), 0o755)
	os.WriteFile(filepath.Join(cfg, "..a", "bl.txt"), nil, 0o644)
	os.Symlink("..a", filepath.Join(cfg, "..data"))
	os.Symlink("..data/bl.txt", filepath.Join(cfg, "bl.txt"))
	os.WriteFile(filepath.Join(other, "ext.txt"), nil, 0o644)
	os.Symlink(filepath.Join(other, "ext.txt"), filepath.Join(cfg, "ext.txt"))
	files := []string{filepath.Join(cfg, "bl.txt"), filepath.Join(cfg, "ext.txt")}
	w := watch(t, files...)

	os.WriteFile(filepath.Join(other, "ext.txt"), []byte("x"), 0o644)
	if !changed(t, w, 200*time.Millisecond) {
		t.Error("a link's target written in another directory: no change")
	}
	os.Mkdir(filepath.Join(cfg, "..b"), 0o755)
	os.WriteFile(filepath.Join(cfg, "..b", "bl.txt"), nil, 0o644)
	os.Symlink("..b", filepath.Join(cfg, "..tmp"))
	os.Rename(filepath.Join(cfg, "..tmp"), filepath.Join(cfg, "..data"))
	if !changed(t, w, 200*time.Millisecond) {
		t.Error("..data swapped: no change")
	}
	w.set(files)
	os.WriteFile(filepath.Join(cfg, "..b", "bl.txt"), []byte("x"), 0o644)
	if !changed(t, w, 200*time.Millisecond) {
		t.Error("the new target written after the swap: no change")
	}
	os.WriteFile(filepath.Join(cfg, "unrelated"), []byte("x"), 0o644)
	if changed(t, w, 200*time.Millisecond) {
		t.Error("an unrelated file written counts as a change")
	}
}
