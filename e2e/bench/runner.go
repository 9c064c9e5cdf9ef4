package main

// runner.go reads the runner pods' records: each pod's log (its node, when
// it took the lock, its request stats) and the usage.json the simulated
// kubelet writes when its process ends (peak RSS, CPU and wall seconds).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// runnerPod is a runner pod's record.
type runnerPod struct {
	RunnerPod

	stats  requestCounts
	locked time.Time // when it took the lock (to the second)
}

var (
	runnerNodeRE   = regexp.MustCompile(`^(\d\d:\d\d:\d\d) operation \S+: .* runner (\S+) on node (\S+) waiting for the lock`)
	runnerLockRE   = regexp.MustCompile(`^(\d\d:\d\d:\d\d) took the lock: `)
	runnerStatsPfx = regexp.MustCompile(`^\d\d:\d\d:\d\d `)
	// runnerPeakRE is the runner's own peak resident memory, its log's last line. The
	// usage the simulator's kubelet records (getrusage's ru_maxrss) is not: a process
	// started with vfork (Go's os/exec) carries its starter's peak into its own, so
	// there it is the simulator's memory whenever that is the larger.
	runnerPeakRE = regexp.MustCompile(`^\d\d:\d\d:\d\d memory: peak resident ([\d.]+) MiB \(VmHWM\)$`)
)

// runnerPods reads every runner pod's log and usage, in the order they took
// the lock, waiting a little for the last one's usage (written when its
// process ends, which may be after the command saw the operation succeed).
func runnerPods(ctx context.Context, logDir string, day time.Time) ([]runnerPod, error) {
	logs, err := filepath.Glob(filepath.Join(logDir, stateNamespace+"_*_runner.log"))
	if err != nil || len(logs) == 0 {
		return nil, fmt.Errorf("no runner pod log in %s", logDir)
	}

	var out []runnerPod

	for _, path := range logs {
		p, err := readRunnerPod(ctx, path, day)
		if err != nil {
			return nil, err
		}

		out = append(out, p)
	}

	sort.Slice(out, func(i, j int) bool { return out[i].locked.Before(out[j].locked) })

	return out, nil
}

func readRunnerPod(ctx context.Context, path string, day time.Time) (runnerPod, error) {
	usagePath := strings.TrimSuffix(path, ".log") + ".usage.json"

	var usage struct {
		Pod         string  `json:"pod"`
		ExitCode    int     `json:"exitCode"`
		MaxRSSBytes int64   `json:"maxRSSBytes"`
		UserSeconds float64 `json:"userSeconds"`
		SysSeconds  float64 `json:"sysSeconds"`
		WallSeconds float64 `json:"wallSeconds"`
	}

	deadline := time.Now().Add(time.Minute)

	for {
		b, err := os.ReadFile(usagePath)
		if err == nil {
			if err := json.Unmarshal(b, &usage); err != nil {
				return runnerPod{}, fmt.Errorf("%s: %w", usagePath, err)
			}

			break
		}

		if time.Now().After(deadline) {
			return runnerPod{}, fmt.Errorf("no usage of the runner pod after a minute: %w", err)
		}

		select {
		case <-ctx.Done():
			return runnerPod{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}

	p := runnerPod{RunnerPod: RunnerPod{
		Name: strings.TrimPrefix(usage.Pod, stateNamespace+"/"), ExitCode: usage.ExitCode,
		MaxRSSMiB:   round(float64(usage.MaxRSSBytes) / (1 << 20)),
		CPUSeconds:  round(usage.UserSeconds + usage.SysSeconds),
		WallSeconds: round(usage.WallSeconds),
	}}

	f, err := os.Open(path)
	if err != nil {
		return p, err
	}
	defer f.Close()

	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)

	peak := false

	for sc.Scan() {
		line := sc.Text()

		if m := runnerNodeRE.FindStringSubmatch(line); m != nil {
			p.Node = m[3]
		}

		if m := runnerLockRE.FindStringSubmatch(line); m != nil {
			p.locked = clockOn(day, m[1])
		}

		if m := runnerPeakRE.FindStringSubmatch(line); m != nil {
			if mib, err := strconv.ParseFloat(m[1], 64); err == nil {
				p.MaxRSSMiB, peak = mib, true
			}
		}

		p.stats.scan(runnerStatsPfx.ReplaceAllString(line, ""))
	}

	if p.stats.kubeBy == nil {
		return p, fmt.Errorf("%s: no request stats lines (is the runner older than its request stats?)", path)
	}

	if !peak {
		return p, fmt.Errorf("%s: no peak memory line (is the runner older than it?)", path)
	}

	p.KubernetesRequests, p.TalosCalls = p.stats.kube, p.stats.talos

	return p, sc.Err()
}

// clockOn is the time of day hh:mm:ss (UTC) on the day of t, or the next day
// when that is more than an hour before t.
func clockOn(t time.Time, hms string) time.Time {
	c, err := time.Parse("15:04:05", hms)
	if err != nil {
		return time.Time{}
	}

	t = t.UTC()
	at := time.Date(t.Year(), t.Month(), t.Day(), c.Hour(), c.Minute(), c.Second(), 0, time.UTC)

	if at.Before(t.Add(-time.Hour)) {
		at = at.Add(24 * time.Hour)
	}

	return at
}
