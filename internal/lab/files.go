package lab

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Files writes a study's report files into Dir and keeps their paths.
type Files struct {
	Dir   string
	Paths []string
}

// Write writes one file.
func (f *Files) Write(name string, data []byte) error {
	p := filepath.Join(f.Dir, name)
	f.Paths = append(f.Paths, p)
	return os.WriteFile(p, data, 0o644)
}

// JSON writes v, indented.
func (f *Files) JSON(name string, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return f.Write(name, append(js, '\n'))
}

// CSV writes what writeCSV writes.
func (f *Files) CSV(name string, writeCSV func(io.Writer) error) error {
	var b bytes.Buffer
	if err := writeCSV(&b); err != nil {
		return err
	}
	return f.Write(name, b.Bytes())
}

// Charts writes name.png and name.svg.
func (f *Files) Charts(name string, chart func(format string) ([]byte, error)) error {
	for _, format := range []string{"png", "svg"} {
		b, err := chart(format)
		if err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		if err := f.Write(name+"."+format, b); err != nil {
			return err
		}
	}
	return nil
}
