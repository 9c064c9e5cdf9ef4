package main

// report.go holds the figures' shapes every report shares: the machine they
// were taken on, a spread of runs, rounding, and the request stats lines the
// plugin (--request-stats) and the runner print.

import (
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Machine describes where the figures were taken.
type Machine struct {
	CPUs          int    `json:"cpus"`
	OS            string `json:"os"`
	LoadAvgBefore string `json:"loadAverageBefore"`
}

func machine() Machine {
	return Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, LoadAvgBefore: loadAvg()}
}

// load1 is the one-minute load average of a loadAvg line.
func load1(avg string) string {
	if f := strings.Fields(avg); len(f) > 0 {
		return f[0]
	}

	return "?"
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// Spread is the median, min and max of the runs.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func spread(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	median := s[len(s)/2]
	if len(s)%2 == 0 {
		median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Spread{Median: round(median), Min: s[0], Max: s[len(s)-1]}
}

func round(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// met says whether a target was met, as the verdicts write it.
func met(b bool) string {
	if b {
		return "met"
	}
	return "NOT met"
}

// requestCounts are one process's request stats.
type requestCounts struct {
	kube, talos, talosNodes int
	kubeBy, talosBy         map[string]int
}

var (
	kubeStatsRE  = regexp.MustCompile(`^request stats: kubernetes (\d+) requests \((.*)\)$`)
	talosStatsRE = regexp.MustCompile(`^request stats: talos (\d+) calls to (\d+) nodes \((.*)\)$`)
)

// scan reads a request stats line into c, if it is one.
func (c *requestCounts) scan(line string) {
	if m := kubeStatsRE.FindStringSubmatch(line); m != nil {
		c.kube, _ = strconv.Atoi(m[1])
		c.kubeBy = parseBreakdown(m[2])
	}
	if m := talosStatsRE.FindStringSubmatch(line); m != nil {
		c.talos, _ = strconv.Atoi(m[1])
		c.talosNodes, _ = strconv.Atoi(m[2])
		c.talosBy = parseBreakdown(m[3])
	}
}

// parseBreakdown reads "GET /api/v1/nodes 1, GET /metrics 1".
func parseBreakdown(s string) map[string]int {
	out := map[string]int{}
	for _, part := range strings.Split(s, ", ") {
		i := strings.LastIndex(part, " ")
		if i < 0 {
			continue
		}
		n, err := strconv.Atoi(part[i+1:])
		if err == nil {
			out[part[:i]] = n
		}
	}
	return out
}

// breakdownLine writes a breakdown back as one line, by key.
func breakdownLine(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
