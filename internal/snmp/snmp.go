// Package snmp reads the kernel's protocol counters: /proc/net/snmp,
// netstat and snmp6, by nstat's names.
package snmp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Counters maps a counter's name to its value. Names are nstat's: the
// table's prefix glued to the field, e.g. UdpRcvbufErrors, IpOutDiscards,
// TcpExtListenOverflows, Udp6SndbufErrors.
type Counters map[string]uint64

// Parse reads /proc/net/snmp or /proc/net/netstat: pairs of lines, a
// header of field names and a line of values, both starting "Prefix:".
func Parse(r io.Reader, into Counters) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		header := strings.Fields(sc.Text())
		if len(header) == 0 {
			continue
		}
		if !sc.Scan() {
			return fmt.Errorf("line %d: %s has no line of values", line, header[0])
		}
		line++
		values := strings.Fields(sc.Text())
		if len(values) != len(header) || values[0] != header[0] {
			return fmt.Errorf("line %d: %d values for %d fields of %s", line, len(values)-1, len(header)-1, header[0])
		}
		prefix := strings.TrimSuffix(header[0], ":")
		for i := 1; i < len(header); i++ {
			// Some fields (Tcp MaxConn) are -1: signed, kept as 0.
			v, err := strconv.ParseInt(values[i], 10, 64)
			if err != nil {
				u, uerr := strconv.ParseUint(values[i], 10, 64)
				if uerr != nil {
					return fmt.Errorf("line %d: %s%s: %w", line, prefix, header[i], err)
				}
				into[prefix+header[i]] = u
				continue
			}
			into[prefix+header[i]] = uint64(max(v, 0))
		}
	}
	return sc.Err()
}

// Parse6 reads /proc/net/snmp6: one "Name value" a line.
func Parse6(r io.Reader, into Counters) error {
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return fmt.Errorf("line %d: want a name and a value, got %q", line, sc.Text())
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return fmt.Errorf("line %d: %s: %w", line, f[0], err)
		}
		into[f[0]] = v
	}
	return sc.Err()
}

// ReadThread reads snmp, netstat and snmp6 of the calling thread's network
// namespace into into. /proc/thread-self, not /proc/self: a process's
// /proc/self/net is the namespace of its first thread. snmp6 is absent
// where IPv6 is disabled, which is no error.
func ReadThread(into Counters) error {
	var errs []error
	for _, f := range []struct {
		name  string
		parse func(io.Reader, Counters) error
	}{{"snmp", Parse}, {"netstat", Parse}, {"snmp6", Parse6}} {
		path := "/proc/thread-self/net/" + f.name
		fh, err := os.Open(path)
		if f.name == "snmp6" && errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil {
			err = f.parse(fh, into)
			fh.Close()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
	}
	return errors.Join(errs...)
}
