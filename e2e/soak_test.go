//go:build e2e && soak

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubectl/pkg/drain"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
	"github.com/ichor-dev/kubectl-ichor/e2e/soak"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// The soak's bounds: how long one run may take from its launch, how many times the
// operator resumes a paused operation before the run is judged as it stands, and how
// long the runner's credentials may take to go once it ended.
const (
	soakRunBound    = 20 * time.Minute
	soakMaxResumes  = 5
	soakCleanupWait = time.Minute
)

// soakReport is one run's record in _output/soak.
type soakReport struct {
	Run      soak.Run     `json:"run"`
	Outcome  soak.Outcome `json:"outcome"`
	Problems []string     `json:"problems,omitempty"`
	// Injected and Skipped are the faults applied, and those whose moment came after
	// the operation had ended (or, for a second operation, once it had).
	Injected []string     `json:"injected,omitempty"`
	Skipped  []string     `json:"skipped,omitempty"`
	Pauses   []soak.Pause `json:"pauses,omitempty"`
	Resumes  int          `json:"resumes"`
	Final    soak.Final   `json:"final"`
	Seconds  float64      `json:"seconds"`
}

// soakSummary is _output/soak/summary.json.
type soakSummary struct {
	FirstSeed           uint64         `json:"firstSeed"`
	Runs                int            `json:"runs"`
	Succeeded           int            `json:"succeeded"`
	PausedThenSucceeded int            `json:"pausedThenSucceeded"`
	Broken              int            `json:"broken"`
	BrokenSeeds         []uint64       `json:"brokenSeeds,omitempty"`
	SelfCheck           soak.Outcome   `json:"selfCheck,omitempty"`
	FaultsByKind        map[string]int `json:"faultsByKind"`
	Seconds             float64        `json:"seconds"`
	// Stopped says why fewer runs than asked were made (the time bound).
	Stopped string `json:"stopped,omitempty"`
}

func (s soakSummary) line() string {
	return fmt.Sprintf("soak: %d runs, %d succeeded, %d paused then succeeded, %d broken", s.Runs, s.Succeeded, s.PausedThenSucceeded, s.Broken)
}

// TestSoak runs SOAK_RUNS upgrades (default 3) of seeds SOAK_SEED, SOAK_SEED+1, ... (default
// the clock), each on a fresh local cluster under its seed's faults, judges each with the
// independent checker of package soak, and writes the report to SOAK_OUT (default
// _output/soak). A self-check run goes with them (SOAK_SELF_CHECK=0 leaves it out). No
// run starts once SOAK_TIMEOUT (default 50m) has passed.
func TestSoak(t *testing.T) {
	runs := soakEnvInt(t, "SOAK_RUNS", 3)
	first := uint64(time.Now().UnixNano())
	if s := os.Getenv("SOAK_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: pass a whole number, the first run's seed", s)
		}
		first = v
	}
	bound := 50 * time.Minute
	if s := os.Getenv("SOAK_TIMEOUT"); s != "" {
		v, err := time.ParseDuration(s)
		if err != nil || v <= 0 {
			t.Fatalf("SOAK_TIMEOUT=%q: pass a duration such as 50m", s)
		}
		bound = v
	}
	out := os.Getenv("SOAK_OUT")
	if out == "" {
		out = filepath.Join("..", "_output", "soak")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	sum := soakSummary{FirstSeed: first, FaultsByKind: map[string]int{}}

	finish := func() {
		sum.Seconds = time.Since(start).Round(time.Second).Seconds()
		writeJSON(t, filepath.Join(out, "summary.json"), sum)
		if err := os.WriteFile(filepath.Join(out, "summary.txt"), []byte(sum.line()+"\n"), 0o644); err != nil {
			t.Error(err)
		}
		t.Log(sum.line())
	}
	defer finish()

	var runList []soak.Run
	if os.Getenv("SOAK_SELF_CHECK") != "0" {
		runList = append(runList, soak.SelfCheck(first))
	}
	for i := range runs {
		runList = append(runList, soak.Generate(first+uint64(i)))
	}

	// The runs go side by side, as many as go test's -parallel (SOAK_PARALLEL in
	// hack/soak.sh); the group returns when every one has ended.
	reps := make([]*soakReport, len(runList))
	t.Run("runs", func(t *testing.T) {
		for i, r := range runList {
			t.Run(soakName(r), func(t *testing.T) {
				t.Parallel()
				if time.Since(start) > bound {
					t.Skipf("SOAK_TIMEOUT %s has passed", bound)
				}
				reps[i] = &soakReport{Run: r}
				soakRun(t, reps[i], out)
			})
		}
	})

	skipped := 0
	for i, rep := range reps {
		r := runList[i]
		if rep == nil {
			skipped++
			continue
		}
		t.Logf("%s: %s in %.0fs, %d pause(s), %d resume(s)", soakName(r), rep.Outcome, rep.Seconds, len(rep.Pauses), rep.Resumes)
		if r.SelfCheck {
			sum.SelfCheck = rep.Outcome
			if rep.Outcome != soak.PausedAsExpected {
				t.Errorf("self-check (seed %d): %s: %s", r.Seed, rep.Outcome, strings.Join(rep.Problems, "; "))
			}
			continue
		}

		sum.Runs++
		for _, f := range rep.Injected {
			kind, _, _ := strings.Cut(f, " ")
			sum.FaultsByKind[kind]++
		}
		switch rep.Outcome {
		case soak.Succeeded:
			sum.Succeeded++
		case soak.PausedThenSucceeded:
			sum.PausedThenSucceeded++
		default:
			sum.Broken++
			sum.BrokenSeeds = append(sum.BrokenSeeds, r.Seed)
			t.Errorf("run %d broken (replay: SOAK_SEED=%d SOAK_RUNS=1 SOAK_SELF_CHECK=0 make soak): %s", r.Seed, r.Seed, strings.Join(rep.Problems, "; "))
		}
	}
	if skipped > 0 {
		// Counted once every run is: the runs go side by side, in no set order.
		sum.Stopped = fmt.Sprintf("SOAK_TIMEOUT %s passed: %d of %d runs made", bound, sum.Runs, runs)
		t.Log(sum.Stopped)
	}
}

func soakName(r soak.Run) string {
	if r.SelfCheck {
		return "self-check-" + strconv.FormatUint(r.Seed, 10)
	}
	return "seed-" + strconv.FormatUint(r.Seed, 10)
}

// soakRun makes one run and writes its record to out; a run the driver itself could
// not carry out (the cluster did not start) is broken, saying why.
func soakRun(t *testing.T, rep *soakReport, out string) {
	r := rep.Run
	start := time.Now()
	defer func() {
		rep.Seconds = time.Since(start).Round(time.Second).Seconds()
		if rep.Outcome == "" {
			rep.Outcome = soak.Broken
			rep.Problems = append(rep.Problems, "the driver could not carry the run out: see the test log of "+soakName(r))
		}
		writeJSON(t, filepath.Join(out, soakName(r)+".json"), rep)
	}()
	t.Logf("%s on %s, max-unavailable %d; faults: %v", r.Scenario, r.Shape, r.MaxUnavailable, r.Faults)
	d := &soakDriver{run: r, rep: rep}
	d.do(t)
}

// soakDriver carries one run out: the cluster, the launch, the faults at their moments,
// the operator's resumes, and the facts the checker judges.
type soakDriver struct {
	run soak.Run
	rep *soakReport

	c      *Cluster
	env    []string // the plugin's environment
	faults string   // the faults file

	mu      sync.Mutex
	active  map[int]soak.Fault // the faults file's faults now on, by index in the schedule
	cordons []soak.Window
	ended   bool                   // the operation ended (Succeeded, or Paused for the self-check)
	applied map[int]bool           // the faults applied, by index in the schedule
	cleared map[int]bool           // the lasting faults cleared
	follows map[int]*followProcess // the FollowerInterrupted faults' `status --watch`
	nodes   map[int]string         // the RunnerNodeDrained faults' nodes, found when they came
	drains  sync.WaitGroup         // the NodeDrained faults' evictions
}

func (d *soakDriver) do(t *testing.T) {
	r := d.run
	d.env = cleanEnv(t, nil)
	d.faults = filepath.Join(t.TempDir(), "faults.yaml")
	if err := os.WriteFile(d.faults, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d.active, d.applied, d.cleared, d.follows = map[int]soak.Fault{}, map[int]bool{}, map[int]bool{}, map[int]*followProcess{}
	d.nodes = map[int]string{}

	args := []string{"--control-planes", strconv.Itoa(r.Shape.ControlPlanes), "--workers", strconv.Itoa(r.Shape.Workers),
		"--kubernetes", r.Scenario.Kubernetes, "--talos", r.Scenario.Talos, "--faults", d.faults,
		"--image", "ghcr.io/ichor-dev/kubectl-ichor=" + jobImageRoot(t)}
	if r.Scenario.Layout != "" {
		args = append(args, "--config-layout", r.Scenario.Layout)
	}
	d.c = startCluster(t, args...)
	if r.Shape.Workers > 0 {
		addWorkload(t, d.c, 2)
	}

	upgrade := []string{"upgrade", r.Scenario.Upgrade}
	if r.Scenario.Upgrade == soak.Path {
		upgrade = append(upgrade, "--talos", r.Scenario.To, "--kubernetes", r.Scenario.ToKubernetes)
	} else {
		upgrade = append(upgrade, "--to", r.Scenario.To)
	}
	upgrade = append(upgrade, "--yes", "--detach", "--max-unavailable", strconv.Itoa(r.MaxUnavailable))
	if r.Scenario.Changes() {
		// A blocked apply pauses in seconds, not the default five minutes.
		upgrade = append(upgrade, "--apply-timeout", "20s")
	}
	if r.Scenario.Reboots() {
		upgrade = append(upgrade, "--upgrade-timeout", "1m")
		if r.Shape.ControlPlanes < 3 {
			// What the plan asks of an operator whose etcd cannot keep quorum
			// through a control plane's reboot.
			upgrade = append(upgrade, "--allow-etcd-outage")
		}
	}
	res, err := d.ichor(3*time.Minute, upgrade...)
	if err != nil || res.code != 0 {
		t.Fatalf("launch: %v (exit %d)\nstdout:\n%s\nstderr:\n%s", err, res.code, res.stdout, res.stderr)
	}
	launched := time.Now()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.schedule(ctx, t, launched, upgrade)
	}()

	d.follow(t, launched)
	cancel()
	wg.Wait()
	d.clearAll(t)
	d.judge(t)
}

// follow watches the status document until the operation ends, resuming a paused
// operation once the faults are over, as an operator would.
func (d *soakDriver) follow(t *testing.T, launched time.Time) {
	deadline := launched.Add(soakRunBound)
	lastPause := ""
	for time.Now().Before(deadline) {
		op, err := d.status()
		if err != nil {
			t.Logf("status: %v", err)
			time.Sleep(2 * time.Second)
			continue
		}
		switch op.Status.Phase {
		case api.PhaseSucceeded, api.PhaseAborted:
			d.end()
			return
		case api.PhasePaused:
			key := fmt.Sprintf("%d %s %s %s", op.Status.Attempt, op.Status.Stage, op.Status.PausedNode, op.Status.Reason)
			if key != lastPause {
				lastPause = key
				p := soak.Pause{Stage: op.Status.Stage, Node: op.Status.PausedNode, Reason: op.Status.Reason, Action: op.Status.Action}
				d.rep.Pauses = append(d.rep.Pauses, p)
				t.Logf("paused: %s %s: %s (what to do: %s)", p.Stage, p.Node, p.Reason, p.Action)
			}
			if d.run.SelfCheck {
				d.end()
				return
			}
			if d.rep.Resumes >= soakMaxResumes {
				t.Logf("paused after %d resumes: judged as it stands", d.rep.Resumes)
				d.end()
				return
			}
			// The operator clears the faults (they end by the schedule) and resumes.
			if wait := time.Until(d.faultsOver(launched)); wait > 0 {
				time.Sleep(wait)
			}
			d.rep.Resumes++
			res, err := d.ichor(3*time.Minute, "resume", "--detach")
			t.Logf("resume %d: exit %d %v %s", d.rep.Resumes, res.code, err, strings.TrimSpace(res.stderr))
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("the operation did not end within %s of its launch", soakRunBound)
	d.end()
}

// faultsOver is when the last lasting fault of the schedule is cleared.
func (d *soakDriver) faultsOver(launched time.Time) time.Time {
	over := launched
	for _, f := range d.run.Faults {
		if f.Kind == soak.AllEtcdStopped {
			continue
		}
		if end := launched.Add(f.At.Duration + f.For.Duration); end.After(over) {
			over = end
		}
	}
	return over
}

func (d *soakDriver) end() {
	d.mu.Lock()
	d.ended = true
	d.mu.Unlock()
}

func (d *soakDriver) hasEnded() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ended
}

// schedule applies each fault at its moment and clears the lasting ones after theirs.
func (d *soakDriver) schedule(ctx context.Context, t *testing.T, launched time.Time, upgrade []string) {
	type event struct {
		at    time.Time
		i     int
		clear bool
	}
	var evs []event
	for i, f := range d.run.Faults {
		evs = append(evs, event{at: launched.Add(f.At.Duration), i: i})
		if f.For.Duration > 0 {
			evs = append(evs, event{at: launched.Add(f.At.Duration + f.For.Duration), i: i, clear: true})
		}
	}
	slices.SortStableFunc(evs, func(a, b event) int { return a.at.Compare(b.at) })
	for _, e := range evs {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(e.at)):
		}
		f := d.run.Faults[e.i]
		if e.clear {
			d.mu.Lock()
			on := d.applied[e.i] && !d.cleared[e.i]
			d.mu.Unlock()
			if on {
				d.clearFault(t, e.i, f)
			}
			continue
		}
		if d.hasEnded() && !d.run.SelfCheck {
			d.rep.Skipped = append(d.rep.Skipped, f.String())
			continue
		}
		if err := d.apply(t, e.i, f, upgrade); err != nil {
			t.Logf("fault %s: %v", f, err)
			d.rep.Skipped = append(d.rep.Skipped, f.String()+": "+err.Error())
			continue
		}
		d.mu.Lock()
		d.applied[e.i] = true
		d.mu.Unlock()
		name := f.String()
		if f.Kind == soak.RunnerNodeDrained {
			name += " (" + d.nodeOf(e.i, f) + ")"
		}
		d.rep.Injected = append(d.rep.Injected, name)
		t.Logf("fault on: %s", name)
	}
}

func (d *soakDriver) apply(t *testing.T, i int, f soak.Fault, upgrade []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch f.Kind {
	case soak.RunnerKilled, soak.RunnerEvicted:
		pod := d.runnerPod(ctx)
		if pod == "" {
			return errors.New("no runner holds the lock")
		}
		if f.Kind == soak.RunnerKilled {
			zero := int64(0)
			return d.c.Client.CoreV1().Pods(jobNamespace).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
		return d.c.Client.CoreV1().Pods(jobNamespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: jobNamespace}})
	case soak.NodeCordoned, soak.NodeDrained, soak.RunnerNodeDrained:
		node := f.Node
		if f.Kind == soak.RunnerNodeDrained {
			var err error
			if node, err = d.runnerNode(ctx); err != nil {
				return err
			}
			d.mu.Lock()
			d.nodes[i] = node
			d.mu.Unlock()
			t.Logf("fault %s: the runner runs on %s", f, node)
		}
		// The person's window opens before the cordon is written, so that the
		// simulator's record of it (seen from a watch, a moment after the write)
		// falls inside; a failed cordon closes it again at once.
		from := time.Now()
		if err := d.setUnschedulable(ctx, node, true); err != nil {
			d.mu.Lock()
			d.cordons = append(d.cordons, soak.Window{Node: node, From: from, To: time.Now()})
			d.mu.Unlock()
			return err
		}
		d.mu.Lock()
		d.cordons = append(d.cordons, soak.Window{Node: node, From: from})
		d.mu.Unlock()
		if f.Kind != soak.NodeCordoned {
			// kubectl drain's evictions, which a PodDisruptionBudget may hold
			// back: they go on beside the schedule, bounded.
			d.drains.Add(1)
			go func() {
				defer d.drains.Done()
				if err := d.drain(node, f.For.Duration); err != nil {
					t.Logf("drain %s: %v", node, err)
				}
			}()
		}
		return nil
	case soak.StateWriteDenied:
		return d.denyStateWrites(ctx, true)
	case soak.PDBBlocking:
		return d.setPDB(ctx, 0)
	case soak.FollowerInterrupted:
		return d.startFollower(i)
	case soak.SecondOperation:
		res, err := d.ichor(3*time.Minute, upgrade...)
		if err != nil {
			return err
		}
		if res.code == 0 {
			d.rep.Problems = append(d.rep.Problems, "a second operation was launched while the first one ran: "+strings.TrimSpace(res.stdout))
		}
		return nil
	default:
		d.mu.Lock()
		d.active[i] = f
		err := d.writeFaults()
		d.mu.Unlock()
		return err
	}
}

func (d *soakDriver) clearFault(t *testing.T, i int, f soak.Fault) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d.mu.Lock()
	d.cleared[i] = true
	d.mu.Unlock()
	switch f.Kind {
	case soak.StateWriteDenied:
		if err := d.denyStateWrites(ctx, false); err != nil {
			t.Logf("allow state writes: %v", err)
		}
	case soak.PDBBlocking:
		if err := d.setPDB(ctx, 1); err != nil {
			t.Logf("restore the PodDisruptionBudget: %v", err)
		}
	case soak.FollowerInterrupted:
		d.interruptFollower(t, i)
	case soak.NodeCordoned, soak.NodeDrained, soak.RunnerNodeDrained:
		node := d.nodeOf(i, f)
		if d.personHolds(node) {
			// Another of the person's cordons of the node is still on: it
			// stays cordoned until that one clears.
			break
		}
		if err := d.setUnschedulable(ctx, node, false); err != nil {
			t.Logf("uncordon %s: %v", node, err)
		}
		d.mu.Lock()
		for j := range d.cordons {
			if d.cordons[j].Node == node && d.cordons[j].To.IsZero() {
				d.cordons[j].To = time.Now()
			}
		}
		d.mu.Unlock()
	default:
		d.mu.Lock()
		delete(d.active, i)
		if err := d.writeFaults(); err != nil {
			t.Logf("clear %s: %v", f, err)
		}
		d.mu.Unlock()
	}
	t.Logf("fault off: %s", f)
}

// clearAll clears what is still on at the end (the self-check's etcd, a cordon whose
// moment had not come), then waits for the kube-apiserver, which an apiserver-restart
// may have left starting again.
func (d *soakDriver) clearAll(t *testing.T) {
	for i, f := range d.run.Faults {
		d.mu.Lock()
		open := d.applied[i] && f.Lasting() && !d.cleared[i]
		d.mu.Unlock()
		if open {
			d.clearFault(t, i, f)
		}
	}
	d.drains.Wait()
	eventually(t, 2*time.Minute, "the kube-apiserver ready", func(ctx context.Context) error {
		return d.c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
	})
}

// writeFaults writes the faults file from the active faults; d.mu is held.
func (d *soakDriver) writeFaults() error {
	file := faults.File{Nodes: map[string]faults.Node{}}
	for _, f := range d.active {
		if f.Kind == soak.APIServerRestart {
			file.APIServerDown = true
			continue
		}
		nodes := []string{f.Node}
		if f.Kind == soak.AllEtcdStopped {
			nodes = d.run.Shape.Nodes()[:d.run.Shape.ControlPlanes]
		}
		for _, name := range nodes {
			n := file.Nodes[name]
			switch f.Kind {
			case soak.TalosUnavailable:
				n.Unreachable = true
			case soak.TalosSlow:
				if d.run.Scenario.Upgrade == soak.Kubernetes {
					n.ApplyBlocks = true
				} else {
					n.InstallHangs = true
				}
			case soak.TalosStreamReset:
				n.UpgradeUnavailable = true
			case soak.EtcdStopped, soak.AllEtcdStopped:
				n.EtcdStopped = true
			case soak.EtcdAlarm:
				n.EtcdAlarm = "NOSPACE"
			case soak.NodePoweredOff:
				n.PoweredOff = true
			}
			file.Nodes[name] = n
		}
	}
	b, err := yaml.Marshal(file)
	if err != nil {
		return err
	}
	return os.WriteFile(d.faults, b, 0o644)
}

func (d *soakDriver) setUnschedulable(ctx context.Context, node string, on bool) error {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
	_, err := d.c.Client.CoreV1().Nodes().Patch(ctx, node, "application/strategic-merge-patch+json", []byte(patch), metav1.PatchOptions{})
	return err
}

// runnerPod is the pod holding the lock, "" when none does.
func (d *soakDriver) runnerPod(ctx context.Context) string {
	l, err := d.c.Client.CoordinationV1().Leases(job.LockNamespace).Get(ctx, job.LockName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	ns, pod, found := strings.Cut(*l.Spec.HolderIdentity, "/")
	if !found || ns != jobNamespace {
		return ""
	}
	return pod
}

// status reads the operation as `kubectl ichor status -o json` prints it.
func (d *soakDriver) status() (*api.Operation, error) {
	res, err := d.ichor(time.Minute, "status", "-o", "json")
	if err != nil {
		return nil, err
	}
	if res.code != 0 {
		return nil, fmt.Errorf("status exit %d: %s", res.code, strings.TrimSpace(res.stderr))
	}
	var op api.Operation
	if err := json.Unmarshal([]byte(res.stdout), &op); err != nil {
		return nil, fmt.Errorf("status -o json: %w", err)
	}
	return &op, nil
}

// judge gathers the facts at the end and has the checker judge them.
func (d *soakDriver) judge(t *testing.T) {
	ctx := context.Background()
	facts := soak.Facts{Run: d.run, Pauses: d.rep.Pauses}
	d.mu.Lock()
	facts.Cordons = append([]soak.Window(nil), d.cordons...)
	d.mu.Unlock()

	op, err := d.status()
	if err != nil {
		facts.Final.StateError = err.Error()
	} else {
		facts.Final.Phase = string(op.Status.Phase)
	}

	if facts.Final.Phase == string(api.PhaseSucceeded) {
		// The runner's credentials go as its Job ends (its ServiceAccount, bound to
		// nothing, stays: Runner.Run).
		deadline := time.Now().Add(soakCleanupWait)
		for {
			left, err := runnerCredentials(ctx, t, d.c, true)
			if err == nil && (len(left) == 0 || time.Now().After(deadline)) {
				facts.Final.CredentialsLeft = left
				break
			}
			if err != nil && time.Now().After(deadline) {
				facts.Final.CredentialsLeft = []string{"(not read: " + err.Error() + ")"}
				break
			}
			time.Sleep(2 * time.Second)
		}
	}

	nodes, err := d.c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list nodes: %v", err)
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Spec.Unschedulable || kube.CordonedByIchor(n) {
			facts.Final.Unschedulable = append(facts.Final.Unschedulable, n.Name)
		}
	}
	facts.Events = d.c.Events(t)

	outcome, problems := soak.Judge(facts)
	if len(d.rep.Problems) > 0 {
		outcome = soak.Broken
	}
	d.rep.Outcome, d.rep.Final = outcome, facts.Final
	d.rep.Problems = append(d.rep.Problems, problems...)
	if outcome == soak.Broken {
		t.Errorf("%s: %s", outcome, strings.Join(d.rep.Problems, "; "))
	}
}

// ichor runs the plugin against the run's cluster for at most timeout, saying what
// went wrong instead of failing the run.
func (d *soakDriver) ichor(timeout time.Duration, args ...string) (pluginResult, error) {
	return d.c.runIchor(os.Getenv("ICHOR_PLUGIN"), d.env, timeout, args...)
}

func soakEnvInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		t.Fatalf("%s=%q: pass a whole number", name, s)
	}
	return v
}

func writeJSON(t *testing.T, path string, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Error(err)
		return
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		t.Error(err)
	}
}

// personHolds tells whether one of the schedule's cordons of node is on.
func (d *soakDriver) personHolds(node string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for j, g := range d.run.Faults {
		person := g.Kind == soak.NodeCordoned || g.Kind == soak.NodeDrained || g.Kind == soak.RunnerNodeDrained
		if person && d.nodeOfLocked(j, g) == node && d.applied[j] && !d.cleared[j] {
			return true
		}
	}
	return false
}

// nodeOf is the node of the schedule's fault i: its own, or the runner's node a
// RunnerNodeDrained found when it came.
func (d *soakDriver) nodeOf(i int, f soak.Fault) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nodeOfLocked(i, f)
}

func (d *soakDriver) nodeOfLocked(i int, f soak.Fault) string {
	if f.Kind == soak.RunnerNodeDrained {
		return d.nodes[i]
	}
	return f.Node
}

// runnerNode is the node the lock holder's pod runs on.
func (d *soakDriver) runnerNode(ctx context.Context) (string, error) {
	name := d.runnerPod(ctx)
	if name == "" {
		return "", errors.New("no runner holds the lock")
	}
	pod, err := d.c.Client.CoreV1().Pods(jobNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if pod.Spec.NodeName == "" {
		return "", fmt.Errorf("runner pod %s is not scheduled", name)
	}
	return pod.Spec.NodeName, nil
}

// drain is a person's kubectl drain of node (cordoned already): its pods evicted as
// kubectl's drain evicts them (DaemonSets' and mirror pods left), for at most bound.
func (d *soakDriver) drain(node string, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), bound+10*time.Second)
	defer cancel()
	h := &drain.Helper{
		Ctx: ctx, Client: d.c.Client, Force: true, IgnoreAllDaemonSets: true, DeleteEmptyDirData: true,
		GracePeriodSeconds: -1, Timeout: bound, Out: io.Discard, ErrOut: io.Discard,
	}
	return drain.RunNodeDrain(h, node)
}

// soakPolicy names the admission policy and binding of the StateWriteDenied fault.
const soakPolicy = "soak-deny-state-writes"

// denyStateWrites puts in place (on) or removes the admission policy that denies every
// update of the state ConfigMap, as a cluster's policy engine might.
func (d *soakDriver) denyStateWrites(ctx context.Context, on bool) error {
	adm := d.c.Client.AdmissionregistrationV1()
	if !on {
		errB := adm.ValidatingAdmissionPolicyBindings().Delete(ctx, soakPolicy, metav1.DeleteOptions{})
		errP := adm.ValidatingAdmissionPolicies().Delete(ctx, soakPolicy, metav1.DeleteOptions{})
		return errors.Join(ignoreNotFound(errB), ignoreNotFound(errP))
	}
	fail := admissionregistrationv1.Fail
	_, err := adm.ValidatingAdmissionPolicies().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: soakPolicy},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{
						APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"},
					},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: fmt.Sprintf("object.metadata.name != %q", job.StateName),
				Message:    "updates of the upgrade's state are denied by policy (the soak's state-write-denied fault)",
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	_, err = adm.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: soakPolicy},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        soakPolicy,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: jobNamespace},
			}},
		},
	}, metav1.CreateOptions{})
	return err
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// setPDB sets the workload's PodDisruptionBudget (addWorkload's "web") to allow
// maxUnavailable disruptions: 0 blocks every eviction of its pods.
func (d *soakDriver) setPDB(ctx context.Context, maxUnavailable int) error {
	patch := fmt.Sprintf(`{"spec":{"maxUnavailable":%d}}`, maxUnavailable)
	_, err := d.c.Client.PolicyV1().PodDisruptionBudgets("default").Patch(ctx, "web", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// followProcess is an operator's `kubectl ichor status --watch`.
type followProcess struct {
	cmd  *exec.Cmd
	out  bytes.Buffer // its output, read once it ended
	done chan struct{}
	err  error
}

// startFollower starts following the operation, as an operator does in a terminal.
func (d *soakDriver) startFollower(i int) error {
	cmd := exec.Command(os.Getenv("ICHOR_PLUGIN"), "status", "--watch", "--kubeconfig", d.c.Kubeconfig, "--talosconfig", d.c.Talosconfig)
	cmd.Env = d.env
	fp := &followProcess{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &fp.out, &fp.out
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() {
		fp.err = cmd.Wait()
		close(fp.done)
	}()
	d.mu.Lock()
	d.follows[i] = fp
	d.mu.Unlock()
	return nil
}

// followerInterruptBound is how soon a follower must end after its Ctrl-C.
const followerInterruptBound = 10 * time.Second

// interruptFollower is the operator's Ctrl-C: the follower must end at once, detached
// (exit 130), and the operation go on; one that ended by itself before (the operation
// paused or ended, which it reports) is left as it is.
func (d *soakDriver) interruptFollower(t *testing.T, i int) {
	d.mu.Lock()
	fp := d.follows[i]
	d.mu.Unlock()
	if fp == nil {
		return
	}
	select {
	case <-fp.done:
		t.Logf("status --watch had ended by itself (%v): %s", fp.err, lastLines(fp.out.String(), 3))
		return
	default:
	}
	_ = fp.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-fp.done:
	case <-time.After(followerInterruptBound):
		_ = fp.cmd.Process.Kill()
		<-fp.done
		d.problem(fmt.Sprintf("status --watch did not end within %s of its Ctrl-C: %s", followerInterruptBound, lastLines(fp.out.String(), 3)))
		return
	}
	var exit *exec.ExitError
	if !errors.As(fp.err, &exit) || exit.ExitCode() != 130 {
		d.problem(fmt.Sprintf("status --watch, interrupted, ended %v, not detached (exit 130): %s", fp.err, lastLines(fp.out.String(), 3)))
		return
	}
	t.Logf("status --watch detached on Ctrl-C: %s", lastLines(fp.out.String(), 1))
}

// problem records a problem the driver saw itself (the run is then broken).
func (d *soakDriver) problem(p string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rep.Problems = append(d.rep.Problems, p)
}

// lastLines is the last n lines of s, joined with " | ".
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}
