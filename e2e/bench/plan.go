package main

// plan.go is the plan benchmark: a cluster of each size, one warm-up plan
// and --runs measured ones, each timed with its child's rusage and its
// request stats.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// planTarget is what a plan of a size should stay under.
type planTarget struct {
	nodes  int
	wall   time.Duration
	rssMiB float64
}

// planTargets are the plan's targets: at 1000 nodes (issue 3) and at 5000
// (issue 28). Other sizes are measured, not judged.
var planTargets = []planTarget{
	{nodes: 1000, wall: 5 * time.Second, rssMiB: 150},
	{nodes: 5000, wall: 5 * time.Second, rssMiB: 300},
}

// runPlan is the plan benchmark.
func runPlan(ctx context.Context, o options) error {
	var targets []SizeTarget
	for _, t := range planTargets {
		targets = append(targets, SizeTarget{Nodes: t.nodes, WallSeconds: t.wall.Seconds(), PeakRSSMiB: t.rssMiB})
	}

	report := Report{
		Benchmark: fmt.Sprintf("kubectl-ichor plan kubernetes --to %s -o json (cluster at %s, Talos %s)", toVersion, fromVersion, talosVersion),
		Started:   time.Now().UTC(),
		Machine:   machine(),
		Runs:      o.runs,
		Targets: Targets{
			Sizes:              targets,
			KubernetesRequests: "the same kinds of request at every size (pods are listed in pages of 500)",
		},
	}
	return suite[Result]{
		name:    "plan",
		sizes:   o.sizes,
		measure: func(ctx context.Context, n int) []Result { return []Result{planSize(ctx, o, n)} },
		failure: func(r Result) (string, string) { return fmt.Sprintf("%d nodes", r.Nodes), r.Error },
		report: func(results []Result) (any, func(io.Writer)) {
			report.Results, report.Verdict = results, verdict(results)
			return report, func(w io.Writer) { writeSummary(w, &report) }
		},
	}.run(ctx, o.out)
}

// planSize starts a cluster of n nodes, plans against it and stops it.
func planSize(ctx context.Context, o options, n int) (r Result) {
	r = Result{Nodes: n, ControlPlanes: controlPlanes, Workers: n - controlPlanes}
	cr := clusterRun{what: fmt.Sprintf("%d nodes", n), nodes: n, logs: fmt.Sprintf("logs-%d-nodes", n)}
	err := withCluster(ctx, o, cr, func(c *simCluster) error {
		r.ClusterStartSeconds = c.startSeconds
		r.LoadAvgBefore = loadAvg()
		var walls, cpus []float64
		for i := 0; i <= o.runs; i++ { // run 0 warms up the apiserver's caches and is not counted
			run, stats, plan, err := planOnce(ctx, o.plugin, c.home, c.kubeconfig, c.talosconfig)
			if err != nil {
				return fmt.Errorf("run %d: %v", i, err)
			}
			if i == 0 {
				r.PlanNodes = planNodes(plan)
				if r.PlanNodes != n {
					return fmt.Errorf("the plan's Kubelets stage has %d nodes, not %d", r.PlanNodes, n)
				}
				continue
			}
			fmt.Fprintf(os.Stderr, "bench: %d nodes: run %d: %.2fs, %.1f MiB, %d Kubernetes requests, %d Talos calls\n",
				n, i, run.WallSeconds, run.PeakRSSMiB, run.KubernetesRequests, run.TalosCalls)
			r.Runs = append(r.Runs, run)
			walls, cpus = append(walls, run.WallSeconds), append(cpus, run.CPUSeconds)
			r.PeakRSSMiB = max(r.PeakRSSMiB, run.PeakRSSMiB)
			r.KubernetesRequests, r.KubernetesByRequest = stats.kube, stats.kubeBy
			r.TalosCalls, r.TalosByMethod, r.TalosNodes = stats.talos, stats.talosBy, stats.talosNodes
		}
		r.Wall, r.CPU = spread(walls), spread(cpus)
		r.LoadAvgAfter = loadAvg()
		return nil
	})
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

// planOnce runs the plan once and measures it.
func planOnce(ctx context.Context, plugin, home, kubeconfig, talosconfig string) (Run, requestCounts, *api.Plan, error) {
	cmd := exec.CommandContext(ctx, plugin, "plan", "kubernetes", "--to", toVersion, "-o", "json", "--request-stats",
		"--kubeconfig", kubeconfig, "--talosconfig", talosconfig)
	cmd.Env = append(os.Environ(), "HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if err != nil {
		return Run{}, requestCounts{}, nil, fmt.Errorf("kubectl-ichor: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	usage, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	run := Run{WallSeconds: round(wall.Seconds())}
	if usage != nil {
		run.PeakRSSMiB = round(float64(usage.Maxrss) / 1024) // KiB on Linux
		cpu := time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
		run.CPUSeconds = round(cpu.Seconds())
	}

	var stats requestCounts
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		stats.scan(sc.Text())
	}
	if stats.kubeBy == nil || stats.talosBy == nil {
		return Run{}, requestCounts{}, nil, fmt.Errorf("no request stats on stderr (is the plugin older than --request-stats?): %q", stderr.String())
	}
	run.KubernetesRequests, run.TalosCalls = stats.kube, stats.talos

	var plan api.Plan
	if err := json.Unmarshal(stdout.Bytes(), &plan); err != nil {
		return Run{}, requestCounts{}, nil, fmt.Errorf("decode the plan: %w", err)
	}
	return run, stats, &plan, nil
}

func planNodes(plan *api.Plan) int {
	for _, s := range plan.Stages {
		if s.Name == "Kubelets" {
			return len(s.Nodes)
		}
	}
	return 0
}
