package lab

import (
	"errors"
	"fmt"
	"time"
)

// Row statuses.
const (
	StatusOK      = "ok"
	StatusSkipped = "skipped"
	StatusFailed  = "failed"
)

// Check is one of rampart's targets, or one of a study's findings,
// computed from rows of the same run.
type Check struct {
	Name   string  `json:"name"`
	Family int     `json:"family"`
	Value  float64 `json:"value"`
	Target string  `json:"target"`
	Met    bool    `json:"met"`
}

// SkipError marks a row this host cannot run: a tool or a kernel feature
// is missing.
type SkipError struct{ Reason string }

func (e SkipError) Error() string { return e.Reason }

// Failure is a row's status and reason after err: skipped when the host
// cannot run it, failed otherwise.
func Failure(err error) (status, reason string) {
	var skip SkipError
	if errors.As(err, &skip) {
		return StatusSkipped, skip.Error()
	}
	return StatusFailed, err.Error()
}

// Median of sorted values.
func Median(sorted []float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// Percentile of sorted values, nearest rank.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// SleepCtx waits d or until done is closed; it reports whether d passed.
func SleepCtx(done <-chan struct{}, d time.Duration) bool {
	select {
	case <-done:
		return false
	case <-time.After(d):
		return true
	}
}

// SetupError is a row's set-up failure: a skip as it is, anything else as
// a failure to set name up.
func SetupError(name string, err error) error {
	var skip SkipError
	if errors.As(err, &skip) {
		return err
	}
	return fmt.Errorf("set up %s: %w", name, err)
}
