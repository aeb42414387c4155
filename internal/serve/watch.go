package serve

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// watcher follows the policy and its list files with inotify.
//
// It watches directories, not files: a deploy tool replaces a file by
// renaming another over it, which a watch on the file would lose. And it
// watches the directories of every symbolic link met on the way to a file
// and of what the link resolves to: a Kubernetes ConfigMap swaps its
// ..data link, and a link's target can be edited in another directory.
//
// A file counts as changed when it is complete: closed after writing
// (IN_CLOSE_WRITE), renamed into place (IN_MOVED_TO), or created as a
// link or a directory (IN_CREATE; a regular file created is written
// next, and closed). A write (IN_MODIFY) marks the file as being written
// until it is closed: no reload reads it meanwhile, whatever else changes.
// fsnotify cannot report IN_CLOSE_WRITE (its option for it is not
// exported), hence inotify itself. Asking /proc which process holds a
// file open for writing would walk every process's descriptors on each
// reload; the events tell it as they happen. What they cannot tell: a
// writer that opened the file before the service started (its close
// reloads, but a reload meanwhile reads what it has written so far), and
// truncate(2) by path, a write with no close: the file counts as written
// until its next close or rename. SIGHUP reloads regardless.
type watcher struct {
	fd      int
	file    *os.File       // fd, for read() (File.Fd would make it blocking)
	dirs    map[int]string // watch descriptor → directory
	names   map[string]bool
	writing map[string]bool // names written and not closed yet
	events  chan inotifyEvent
	done    chan struct{}
}

type inotifyEvent struct {
	wd   int
	mask uint32
	name string
}

const watchMask = unix.IN_CLOSE_WRITE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_CREATE |
	unix.IN_DELETE | unix.IN_MODIFY | unix.IN_ONLYDIR

func newWatcher() (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watch files (inotify; see fs.inotify.max_user_instances): %w", err)
	}
	w := &watcher{
		fd: fd,
		// Non-blocking, the descriptor goes to Go's poller: Close ends a
		// pending Read.
		file: os.NewFile(uintptr(fd), "inotify"),
		dirs: map[int]string{}, names: map[string]bool{}, writing: map[string]bool{},
		events: make(chan inotifyEvent, 64), done: make(chan struct{}),
	}
	go w.read()
	return w, nil
}

func (w *watcher) Close() {
	close(w.done)
	w.file.Close()
}

// read decodes the kernel's events until the descriptor closes, then
// closes the channel.
func (w *watcher) read() {
	defer close(w.events)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			return
		}
		// struct inotify_event: wd, mask, cookie, len, then len bytes of
		// name padded with NULs.
		for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
			l := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:]))
			if l > len(b) {
				break
			}
			ev := inotifyEvent{
				wd:   int(int32(binary.NativeEndian.Uint32(b))),
				mask: binary.NativeEndian.Uint32(b[4:]),
				name: strings.TrimRight(string(b[unix.SizeofInotifyEvent:l]), "\x00"),
			}
			b = b[l:]
			select {
			case w.events <- ev:
			case <-w.done:
				return
			}
		}
	}
}

// set watches files: each, the links on the way to it and what they
// resolve to, by their directories. Called after each reload, it follows
// links that now point elsewhere, and drops directories no longer needed.
// It returns the directories it could not watch.
func (w *watcher) set(files []string) map[string]error {
	w.names = map[string]bool{}
	for _, f := range files {
		for _, n := range resolve(f) {
			w.names[n] = true
		}
	}
	need := map[string]bool{}
	for n := range w.names {
		need[filepath.Dir(n)] = true
	}
	have := map[string]bool{}
	for wd, dir := range w.dirs {
		if need[dir] {
			have[dir] = true
			continue
		}
		unix.InotifyRmWatch(w.fd, uint32(wd))
		delete(w.dirs, wd)
	}
	failed := map[string]error{}
	for dir := range need {
		if have[dir] {
			continue
		}
		wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
		if err != nil {
			failed[dir] = err
			continue
		}
		w.dirs[wd] = dir
	}
	for n := range w.writing {
		if !w.names[n] {
			delete(w.writing, n)
		}
	}
	return failed
}

// handle takes an event: true when a watched file changed and is
// complete, so that the policy should be read again.
func (w *watcher) handle(ev inotifyEvent) bool {
	if ev.mask&unix.IN_Q_OVERFLOW != 0 {
		clear(w.writing) // events were lost: read everything again
		return true
	}
	if ev.mask&unix.IN_IGNORED != 0 { // the directory went
		delete(w.dirs, ev.wd)
		return false
	}
	dir, ok := w.dirs[ev.wd]
	if !ok || ev.name == "" {
		return false
	}
	name := filepath.Join(dir, ev.name)
	if !w.names[name] {
		return false
	}
	switch {
	case ev.mask&unix.IN_MODIFY != 0:
		w.writing[name] = true
	case ev.mask&(unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO) != 0:
		delete(w.writing, name)
		return true
	case ev.mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
		// Gone: what replaces it is an event of its own.
		delete(w.writing, name)
	case ev.mask&unix.IN_CREATE != 0:
		fi, err := os.Lstat(name)
		if err != nil {
			return false
		}
		if !fi.Mode().IsRegular() {
			return true // a link or a directory comes complete
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			return true // a hard link to an existing file
		}
		w.writing[name] = true // open(O_CREAT): written next, then closed
	}
	return false
}

// busy names a watched file that is being written, or "".
func (w *watcher) busy() string {
	for n := range w.writing {
		return n
	}
	return ""
}

// resolve returns path, each symbolic link met on the way to the file it
// names (the path of the link itself), and that file's path: changing any
// of them changes what reading path gives. path is absolute and clean.
func resolve(path string) []string {
	names := []string{path}
	for range 40 { // the kernel's own limit on links in a lookup
		link, target, ok := firstLink(path)
		if !ok {
			break
		}
		if !slices.Contains(names, link) {
			names = append(names, link)
		}
		path = target
	}
	if !slices.Contains(names, path) {
		names = append(names, path)
	}
	return names
}

// firstLink finds the first component of path that is a symbolic link:
// its path, and path with that component replaced by the link's target.
func firstLink(path string) (link, resolved string, ok bool) {
	parts := strings.Split(path, "/")[1:]
	cur := "/"
	for i, p := range parts {
		next := filepath.Join(cur, p)
		fi, err := os.Lstat(next)
		if err != nil {
			return "", "", false
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(next)
			if err != nil {
				return "", "", false
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			return next, filepath.Join(append([]string{target}, parts[i+1:]...)...), true
		}
		cur = next
	}
	return "", "", false
}
