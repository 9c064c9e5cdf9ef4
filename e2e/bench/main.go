// Command bench runs kubectl-ichor's benchmarks against local simulated
// clusters (make bench, through hack/bench.sh): `bench [flags] plan upgrade`.
// It never fails on a timing: it measures, writes the figures and says which
// targets were met; it fails only when a cluster does not start, the plugin
// does not produce a plan or the upgrade does not succeed.
//
// The plan benchmark starts a cluster of each size (3 control planes and the
// rest workers) with ichor-sim, then runs
//
//	kubectl-ichor plan kubernetes --to v1.36.3 -o json --request-stats
//
// a number of times, measuring each run's wall time, peak resident memory
// (the child's rusage) and CPU time, and reading the Kubernetes request and
// Talos call counts the plugin's hidden --request-stats flag prints. It
// writes OUT/plan.json and the summary OUT/plan.txt (also printed).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// Targets of the plan benchmark (issue 3), at the largest size.
const (
	targetWall      = 5 * time.Second
	targetRSSMiB    = 150
	controlPlanes   = 3
	fromVersion     = "v1.36.3"
	toVersion       = "v1.37.2"
	talosVersion    = "v1.14.1" // the current Talos: multi-document configs, the larger to read
	clusterStartMax = 20 * time.Minute
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

type options struct {
	sizes  []int
	runs   int
	out    string
	sim    string
	plugin string
	binDir string

	// The upgrade benchmark's.
	upgradeSizes   []int
	maxUnavailable int
	imageRoot      string
	keepLogs       bool
}

func run() error {
	root, _ := os.Getwd()
	o := options{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	sizes := fs.String("sizes", "5,1000", "cluster sizes in nodes, comma-separated (3 control planes, the rest workers)")
	fs.IntVar(&o.runs, "runs", 5, "measured runs of the plan per size (after one warm-up run)")
	fs.StringVar(&o.out, "out", filepath.Join(root, "_output", "bench"), "directory for plan.json, plan.txt, upgrade.json, upgrade.txt and the logs of a failed cluster")
	fs.StringVar(&o.sim, "sim", filepath.Join(root, "_output", "bin", "ichor-sim"), "the ichor-sim binary")
	fs.StringVar(&o.plugin, "plugin", filepath.Join(root, "_output", "bin", "kubectl-ichor"), "the kubectl-ichor binary")
	fs.StringVar(&o.binDir, "bin-dir", filepath.Join(root, "_output", "cluster-bins"), "the control plane's binaries")
	upgradeSizes := fs.String("upgrade-sizes", "8,23", "upgrade: cluster sizes in nodes, comma-separated (3 control planes, the rest workers)")
	fs.IntVar(&o.maxUnavailable, "max-unavailable", 5, "upgrade: workers upgraded at once")
	fs.StringVar(&o.imageRoot, "image-root", filepath.Join(root, "_output", "image", "rootfs"), "upgrade: the Job image's root filesystem, run by the simulated kubelets")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "upgrade: keep every cluster's logs and events.jsonl in --out, not only a failed one's")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	benchmarks := fs.Args()
	if len(benchmarks) == 0 {
		return errors.New("usage: bench [flags] plan|upgrade ...")
	}
	var err error
	if o.sizes, err = parseSizes("--sizes", *sizes); err != nil {
		return err
	}
	if o.upgradeSizes, err = parseSizes("--upgrade-sizes", *upgradeSizes); err != nil {
		return err
	}
	if o.runs < 1 {
		return fmt.Errorf("--runs %d: want 1 or more", o.runs)
	}
	if o.maxUnavailable < 1 {
		return fmt.Errorf("--max-unavailable %d: want 1 or more", o.maxUnavailable)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var errs []error
	for _, b := range benchmarks {
		switch b {
		case "plan":
			errs = append(errs, runPlan(ctx, o))
		case "upgrade":
			errs = append(errs, runUpgrade(ctx, o))
		default:
			return fmt.Errorf("unknown benchmark %q: want plan or upgrade", b)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

func parseSizes(name, list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < controlPlanes {
			return nil, fmt.Errorf("%s %q: want node counts of %d or more, e.g. 5,1000", name, list, controlPlanes)
		}
		out = append(out, n)
	}
	return out, nil
}

// runPlan is the plan benchmark.
func runPlan(ctx context.Context, o options) error {
	report := Report{
		Benchmark: fmt.Sprintf("kubectl-ichor plan kubernetes --to %s -o json (cluster at %s, Talos %s)", toVersion, fromVersion, talosVersion),
		Started:   time.Now().UTC(),
		Machine:   machine(),
		Runs:      o.runs,
		Targets: Targets{
			WallSeconds: targetWall.Seconds(), PeakRSSMiB: targetRSSMiB,
			KubernetesRequests: "the same kinds of request at every size (pods are listed in pages of 500)",
		},
	}
	var failed []string
	for _, n := range o.sizes {
		r := benchSize(ctx, o, n)
		if r.Error != "" {
			failed = append(failed, fmt.Sprintf("%d nodes: %s", n, r.Error))
			fmt.Fprintf(os.Stderr, "bench: %d nodes: %s\n", n, r.Error)
		}
		report.Results = append(report.Results, r)
		if ctx.Err() != nil {
			break
		}
	}
	report.Verdict = verdict(report.Results)

	b, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "plan.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var summary bytes.Buffer
	writeSummary(&summary, &report)
	if err := os.WriteFile(filepath.Join(o.out, "plan.txt"), summary.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Print(summary.String())
	fmt.Printf("\nwritten: %s, %s\n", filepath.Join(o.out, "plan.json"), filepath.Join(o.out, "plan.txt"))
	if len(failed) > 0 {
		return fmt.Errorf("not measured: %s", strings.Join(failed, "; "))
	}
	return nil
}

// Report is plan.json.
type Report struct {
	Benchmark string    `json:"benchmark"`
	Started   time.Time `json:"started"`
	Machine   Machine   `json:"machine"`
	Runs      int       `json:"runsPerSize"`
	Targets   Targets   `json:"targets"`
	Results   []Result  `json:"results"`
	Verdict   []string  `json:"verdict"`
}

// Machine describes where the figures were taken.
type Machine struct {
	CPUs          int    `json:"cpus"`
	OS            string `json:"os"`
	LoadAvgBefore string `json:"loadAverageBefore"`
}

// Targets are the figures to stay under, at the largest size.
type Targets struct {
	WallSeconds        float64 `json:"wallSeconds"`
	PeakRSSMiB         float64 `json:"peakRSSMiB"`
	KubernetesRequests string  `json:"kubernetesRequests"`
}

// Result is one cluster size.
type Result struct {
	Nodes               int            `json:"nodes"`
	ControlPlanes       int            `json:"controlPlanes"`
	Workers             int            `json:"workers"`
	ClusterStartSeconds float64        `json:"clusterStartSeconds,omitempty"`
	LoadAvgBefore       string         `json:"loadAverageBefore,omitempty"`
	Runs                []Run          `json:"runs,omitempty"`
	Wall                Spread         `json:"wallSeconds"`
	CPU                 Spread         `json:"cpuSeconds"`
	PeakRSSMiB          float64        `json:"peakRSSMiB"`
	KubernetesRequests  int            `json:"kubernetesRequests"`
	KubernetesByRequest map[string]int `json:"kubernetesRequestsByPath,omitempty"`
	TalosCalls          int            `json:"talosCalls"`
	TalosByMethod       map[string]int `json:"talosCallsByMethod,omitempty"`
	TalosNodes          int            `json:"talosNodes"`
	PlanNodes           int            `json:"planNodes"`
	Error               string         `json:"error,omitempty"`
}

// Run is one measured plan.
type Run struct {
	WallSeconds        float64 `json:"wallSeconds"`
	CPUSeconds         float64 `json:"cpuSeconds"`
	PeakRSSMiB         float64 `json:"peakRSSMiB"`
	KubernetesRequests int     `json:"kubernetesRequests"`
	TalosCalls         int     `json:"talosCalls"`
}

// Spread is the median, min and max of the runs.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func machine() Machine {
	return Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, LoadAvgBefore: loadAvg()}
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// benchSize starts a cluster of n nodes, plans against it and stops it.
func benchSize(ctx context.Context, o options, n int) (r Result) {
	r = Result{Nodes: n, ControlPlanes: controlPlanes, Workers: n - controlPlanes}
	fmt.Fprintf(os.Stderr, "bench: %d nodes: starting a cluster of %d control planes and %d workers\n", n, r.ControlPlanes, r.Workers)

	dir, err := os.MkdirTemp("", "ichor-bench-")
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer os.RemoveAll(dir)

	start := time.Now()
	up := exec.CommandContext(ctx, o.sim, "up", "--dir", dir, "--bin-dir", o.binDir,
		"--control-planes", strconv.Itoa(r.ControlPlanes), "--workers", strconv.Itoa(r.Workers),
		"--kubernetes", fromVersion, "--talos", talosVersion, "--wait", clusterStartMax.String())
	out, upErr := up.CombinedOutput()
	// Stop it whatever happened, keeping its logs first when something failed.
	defer func() {
		if r.Error != "" {
			keepLogs(o.out, dir, fmt.Sprintf("logs-%d-nodes", n))
		}
		if out, err := exec.Command(o.sim, "down", "--dir", dir).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: ichor-sim down: %v: %s\n", err, out)
		}
	}()
	if upErr != nil {
		r.Error = fmt.Sprintf("ichor-sim up: %v: %s", upErr, lastLine(out))
		return r
	}
	r.ClusterStartSeconds = round(time.Since(start).Seconds())
	fmt.Fprintf(os.Stderr, "bench: %d nodes: cluster up in %.1fs\n", n, r.ClusterStartSeconds)

	kubeconfig, talosconfig := filepath.Join(dir, cluster.KubeconfigFile), filepath.Join(dir, cluster.TalosconfigFile)
	if err := settle(ctx, kubeconfig, n); err != nil {
		r.Error = err.Error()
		return r
	}
	r.LoadAvgBefore = loadAvg()

	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		r.Error = err.Error()
		return r
	}
	var walls, cpus []float64
	for i := 0; i <= o.runs; i++ { // run 0 warms up the apiserver's caches and is not counted
		run, stats, plan, err := planOnce(ctx, o.plugin, home, kubeconfig, talosconfig)
		if err != nil {
			r.Error = fmt.Sprintf("run %d: %v", i, err)
			return r
		}
		if i == 0 {
			r.PlanNodes = planNodes(plan)
			if r.PlanNodes != n {
				r.Error = fmt.Sprintf("the plan's Kubelets stage has %d nodes, not %d", r.PlanNodes, n)
				return r
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
	return r
}

// settle waits until every node is Ready and kube-proxy runs on all of them:
// a cluster that is still starting pods would be measured with it.
func settle(ctx context.Context, kubeconfig string, n int) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for {
		ds, err := client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
		if err == nil && int(ds.Status.NumberReady) == n && int(ds.Status.DesiredNumberScheduled) == n {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("kube-proxy ready on %d of %d nodes", ds.Status.NumberReady, n)
			}
			return fmt.Errorf("cluster not settled: %w", err)
		case <-time.After(time.Second):
		}
	}
}

type requestCounts struct {
	kube, talos, talosNodes int
	kubeBy, talosBy         map[string]int
}

var (
	kubeStatsRE  = regexp.MustCompile(`^request stats: kubernetes (\d+) requests \((.*)\)$`)
	talosStatsRE = regexp.MustCompile(`^request stats: talos (\d+) calls to (\d+) nodes \((.*)\)$`)
)

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
		if m := kubeStatsRE.FindStringSubmatch(sc.Text()); m != nil {
			stats.kube, _ = strconv.Atoi(m[1])
			stats.kubeBy = parseBreakdown(m[2])
		}
		if m := talosStatsRE.FindStringSubmatch(sc.Text()); m != nil {
			stats.talos, _ = strconv.Atoi(m[1])
			stats.talosNodes, _ = strconv.Atoi(m[2])
			stats.talosBy = parseBreakdown(m[3])
		}
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

func planNodes(plan *api.Plan) int {
	for _, s := range plan.Stages {
		if s.Name == "Kubelets" {
			return len(s.Nodes)
		}
	}
	return 0
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

// verdict compares the largest size measured with the targets, and the
// Kubernetes request counts across sizes.
func verdict(results []Result) []string {
	var ok []Result
	for _, r := range results {
		if r.Error == "" {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return []string{"nothing measured"}
	}
	big := ok[len(ok)-1]
	met := func(b bool) string {
		if b {
			return "met"
		}
		return "NOT met"
	}
	out := []string{
		fmt.Sprintf("wall time under %s at %d nodes: %s (median %.2fs, max %.2fs)", targetWall, big.Nodes, met(big.Wall.Median < targetWall.Seconds()), big.Wall.Median, big.Wall.Max),
		fmt.Sprintf("peak memory under %d MiB at %d nodes: %s (%.1f MiB)", targetRSSMiB, big.Nodes, met(big.PeakRSSMiB < targetRSSMiB), big.PeakRSSMiB),
	}
	var counts []string
	same := true
	for _, r := range ok {
		// The drain preview lists pods in pages of 500: their count grows
		// with the pods, not with the nodes; the kinds of request must not.
		counts = append(counts, fmt.Sprintf("%d (%d kinds) at %d nodes", r.KubernetesRequests, len(r.KubernetesByRequest), r.Nodes))
		same = same && len(r.KubernetesByRequest) == len(ok[0].KubernetesByRequest)
	}
	if len(ok) < 2 {
		out = append(out, fmt.Sprintf("Kubernetes request kinds not growing with the node count: not judged, one size only (%s)", strings.Join(counts, ", ")))
	} else {
		out = append(out, fmt.Sprintf("Kubernetes request kinds not growing with the node count: %s (%s)", met(same), strings.Join(counts, ", ")))
	}
	if big.Nodes < 1000 {
		out = append(out, fmt.Sprintf("the targets are for 1000 nodes; the largest size measured is %d", big.Nodes))
	}
	return out
}

func writeSummary(w io.Writer, r *Report) {
	fmt.Fprintf(w, "%s\n", r.Benchmark)
	fmt.Fprintf(w, "%d measured runs per size after a warm-up; %d CPUs (%s), load average %s at the start; the cluster runs on the same machine\n\n",
		r.Runs, r.Machine.CPUs, r.Machine.OS, r.Machine.LoadAvgBefore)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODES\tCLUSTER START\tWALL median (min-max)\tCPU median\tPEAK RSS\tK8S REQUESTS\tTALOS CALLS")
	for _, x := range r.Results {
		if x.Error != "" {
			fmt.Fprintf(tw, "%d\tfailed: %s\n", x.Nodes, x.Error)
			continue
		}
		fmt.Fprintf(tw, "%d (%d+%d)\t%.1fs\t%.2fs (%.2f-%.2f)\t%.2fs\t%.1f MiB\t%d\t%d to %d nodes\n",
			x.Nodes, x.ControlPlanes, x.Workers, x.ClusterStartSeconds, x.Wall.Median, x.Wall.Min, x.Wall.Max, x.CPU.Median,
			x.PeakRSSMiB, x.KubernetesRequests, x.TalosCalls, x.TalosNodes)
	}
	_ = tw.Flush()
	if len(r.Results) > 0 {
		last := r.Results[len(r.Results)-1]
		if len(last.KubernetesByRequest) > 0 {
			keys := make([]string, 0, len(last.KubernetesByRequest))
			for k := range last.KubernetesByRequest {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			fmt.Fprintf(w, "\nKubernetes requests at %d nodes:\n", last.Nodes)
			for _, k := range keys {
				fmt.Fprintf(w, "  %s %d\n", k, last.KubernetesByRequest[k])
			}
		}
	}
	fmt.Fprintf(w, "\nTargets (never a failure):\n")
	for _, v := range r.Verdict {
		fmt.Fprintf(w, "  %s\n", v)
	}
}

func keepLogs(out, dir, name string) {
	dst := filepath.Join(out, name)
	_ = os.RemoveAll(dst)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return
	}
	for _, p := range []string{cluster.LogDir, cluster.EventsFile} {
		_ = exec.Command("cp", "-r", filepath.Join(dir, p), dst).Run()
	}
	fmt.Fprintf(os.Stderr, "bench: the cluster's logs are kept in %s\n", dst)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
