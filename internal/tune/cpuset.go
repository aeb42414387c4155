package tune

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// CPUSet is a sorted set of CPU numbers. The kernel writes CPU sets in two
// forms: lists ("0-3,8", smp_affinity_list, cpulist) and hex masks in
// 32-bit words ("ff,00000000", rps_cpus, xps_cpus). Written here rather
// than taken from k8s.io/utils/cpuset, which has the lists but not the
// masks.
type CPUSet []int

// ParseCPUList reads "0-3,8" (empty for none).
func ParseCPUList(s string) (CPUSet, error) {
	var set CPUSet
	s = strings.TrimSpace(s)
	if s == "" {
		return set, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b > 1<<16 {
			return nil, fmt.Errorf("%q is not a CPU list", s)
		}
		for c := a; c <= b; c++ {
			set = append(set, c)
		}
	}
	slices.Sort(set)
	return slices.Compact(set), nil
}

// ParseCPUMask reads a hex mask in comma-separated 32-bit words.
func ParseCPUMask(s string) (CPUSet, error) {
	words := strings.Split(strings.TrimSpace(s), ",")
	var set CPUSet
	for i := range words {
		w, err := strconv.ParseUint(words[len(words)-1-i], 16, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CPU mask", s)
		}
		for b := 0; b < 32; b++ {
			if w&(1<<b) != 0 {
				set = append(set, i*32+b)
			}
		}
	}
	return set, nil
}

// List is the set as the kernel prints a CPU list.
func (s CPUSet) List() string {
	var parts []string
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(s[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", s[i], s[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// Mask is the set as a hex mask of at least words 32-bit words (the kernel's
// nr_cpu_ids rounded up), "0" words included.
func (s CPUSet) Mask(words int) string {
	if len(s) > 0 {
		words = max(words, s[len(s)-1]/32+1)
	}
	w := make([]uint32, max(words, 1))
	for _, c := range s {
		w[c/32] |= 1 << (c % 32)
	}
	parts := make([]string, len(w))
	for i, x := range w {
		parts[len(w)-1-i] = fmt.Sprintf("%08x", x)
	}
	return strings.Join(parts, ",")
}

// Without is s less the CPUs of o.
func (s CPUSet) Without(o CPUSet) CPUSet {
	return slices.DeleteFunc(slices.Clone(s), func(c int) bool { return slices.Contains(o, c) })
}

// Intersect is what s and o share.
func (s CPUSet) Intersect(o CPUSet) CPUSet {
	return slices.DeleteFunc(slices.Clone(s), func(c int) bool { return !slices.Contains(o, c) })
}

// Union is what s or o holds.
func (s CPUSet) Union(o CPUSet) CPUSet {
	u := slices.Concat(s, o)
	slices.Sort(u)
	return slices.Compact(u)
}
