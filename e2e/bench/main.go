package main

// main.go is the command line: the flags, then each benchmark named.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
)

// What every benchmark measures: a cluster of 3 control planes at
// fromVersion planned or upgraded to toVersion, on talosVersion.
const (
	controlPlanes   = 3
	fromVersion     = "v1.36.3"
	toVersion       = "v1.37.2"
	talosVersion    = "v1.14.1" // the current Talos: multi-document configs, the larger to read
	clusterStartMax = 20 * time.Minute
	// clusterStartPerNode is how much longer a cluster of more than 2400
	// nodes may take per node: its machines boot and its Nodes register one
	// apiserver request after another.
	clusterStartPerNode = 500 * time.Millisecond
)

// startTimeout is how long ichor-sim up may take for a cluster of n nodes.
func startTimeout(n int) time.Duration {
	return max(clusterStartMax, time.Duration(n)*clusterStartPerNode)
}

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
	// sizeMU is a size's own --max-unavailable ("103:10" in --upgrade-sizes).
	sizeMU map[int]int
	// talosSizes and talosMU are the Talos OS upgrade benchmark's
	// (--talos-sizes).
	talosSizes []int
	talosMU    map[int]int
	imageRoot  string
	keepLogs   bool
	compare    bool
	talosctl   string
	// faults is the faults file of every upgrade cluster ("" for none):
	// podTerminationFaults.
	faults string
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
	upgradeSizes := fs.String("upgrade-sizes", "8,23,103:10", "upgrade: cluster sizes in nodes, comma-separated (3 control planes, the rest workers), each with its own --max-unavailable after a colon")
	talosSizes := fs.String("talos-sizes", "23", "talos: cluster sizes in nodes of the Talos OS upgrade, as --upgrade-sizes")
	fs.IntVar(&o.maxUnavailable, "max-unavailable", 5, "upgrade: workers upgraded at once, at a size without its own")
	fs.StringVar(&o.imageRoot, "image-root", filepath.Join(root, "_output", "image", "rootfs"), "upgrade: the Job image's root filesystem, run by the simulated kubelets")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "upgrade: keep every cluster's logs and events.jsonl in --out, not only a failed one's")
	fs.BoolVar(&o.compare, "compare", true, "upgrade: also run kubectl-ichor one worker at a time (--max-unavailable 1) and the peer, talosctl upgrade-k8s, each on an identical cluster")
	fs.StringVar(&o.talosctl, "talosctl", "", "upgrade: the talosctl binary of --compare (default: talosctl in --bin-dir, as make cluster-bins builds it)")
	fs.DurationVar(&benchLatencies.PodTermination, "pod-termination", 0, "upgrade, talos: how long an evicted pod takes to stop on every node (the simulator's terminationTakes; 0: at once), counted in the bound as T")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	benchmarks := fs.Args()
	if len(benchmarks) == 0 {
		return errors.New("usage: bench [flags] BENCHMARK [BENCHMARK...]: plan, upgrade, talos")
	}
	var err error
	if o.sizes, err = parseSizes("--sizes", *sizes); err != nil {
		return err
	}
	if o.upgradeSizes, o.sizeMU, err = parseUpgradeSizes("--upgrade-sizes", *upgradeSizes); err != nil {
		return err
	}
	if o.talosSizes, o.talosMU, err = parseUpgradeSizes("--talos-sizes", *talosSizes); err != nil {
		return err
	}
	if o.runs < 1 {
		return fmt.Errorf("--runs %d: want 1 or more", o.runs)
	}
	if o.maxUnavailable < 1 {
		return fmt.Errorf("--max-unavailable %d: want 1 or more", o.maxUnavailable)
	}
	if o.talosctl == "" {
		o.talosctl = filepath.Join(o.binDir, "talosctl")
	}
	if benchLatencies.PodTermination < 0 {
		return fmt.Errorf("--pod-termination %s: want 0 or more", benchLatencies.PodTermination)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if benchLatencies.PodTermination > 0 {
		most := slices.Max(append(slices.Clone(o.upgradeSizes), o.talosSizes...))
		if o.faults, err = podTerminationFaults(o.out, most, benchLatencies.PodTermination); err != nil {
			return err
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var errs []error
	for _, b := range benchmarks {
		switch b {
		case "plan":
			errs = append(errs, runPlan(ctx, o))
		case "upgrade":
			errs = append(errs, runUpgrade(ctx, o, kubernetesUpgrade))
		case "talos":
			errs = append(errs, runUpgrade(ctx, o, talosUpgrade))
		default:
			return fmt.Errorf("unknown benchmark %q: want plan, upgrade or talos", b)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

// parseUpgradeSizes parses the flag name's list: node counts, each with its
// own --max-unavailable after a colon ("8,23,103:10").
func parseUpgradeSizes(name, list string) ([]int, map[int]int, error) {
	var sizes []string

	mu := map[int]int{}

	for _, s := range strings.Split(list, ",") {
		size, m, ok := strings.Cut(strings.TrimSpace(s), ":")
		sizes = append(sizes, size)

		if !ok {
			continue
		}

		n, err := strconv.Atoi(size)
		v, merr := strconv.Atoi(m)
		if err != nil || merr != nil || v < 1 {
			return nil, nil, fmt.Errorf("%s %q: want node counts, each with its own --max-unavailable (1 or more) after a colon, e.g. 8,23,103:10", name, list)
		}

		mu[n] = v
	}

	out, err := parseSizes(name, strings.Join(sizes, ","))

	return out, mu, err
}

// muFor is the --max-unavailable of the upgrade of n nodes.
func (o options) muFor(n int) int {
	if mu, ok := o.sizeMU[n]; ok {
		return mu
	}

	return o.maxUnavailable
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

// podTerminationFaults writes dir/faults.yaml, which gives every node of a
// cluster of up to nodes nodes the terminationTakes fault d (the simulator has
// no flag for it), and returns its path.
func podTerminationFaults(dir string, nodes int, d time.Duration) (string, error) {
	var b strings.Builder

	b.WriteString("# written by the benchmark's --pod-termination\nnodes:\n")
	for i := range nodes {
		fmt.Fprintf(&b, "  %s:\n    terminationTakes: %s\n", cluster.MachineName(i, controlPlanes), d)
	}

	path := filepath.Join(dir, "faults.yaml")

	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}
