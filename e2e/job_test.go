//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

const jobNamespace = "ichor-system"

// jobImageRoot is the root filesystem of the kubectl-ichor image for the simulated
// kubelets: hack/build.sh writes it next to $ICHOR_PLUGIN, with that very binary.
func jobImageRoot(t *testing.T) string {
	t.Helper()

	plugin := env(t, "ICHOR_PLUGIN")

	root := os.Getenv("ICHOR_IMAGE_ROOT")
	if root == "" {
		root = filepath.Join(filepath.Dir(filepath.Dir(plugin)), "image", "rootfs")
	}

	bin := filepath.Join(root, "usr", "local", "bin", "kubectl-ichor")
	require.Equal(t, fileSum(t, plugin), fileSum(t, bin), "%s is not $ICHOR_PLUGIN: run hack/build.sh (or set $ICHOR_IMAGE_ROOT)", bin)

	return root
}

func fileSum(t *testing.T, path string) string {
	t.Helper()

	f, err := os.Open(path)
	require.NoError(t, err)

	defer f.Close()

	h := sha256.New()
	_, err = io.Copy(h, f)
	require.NoError(t, err)

	return fmt.Sprintf("%x", h.Sum(nil))
}

// startJobCluster starts a 3+2 cluster whose pods of the kubectl-ichor image run the
// plugin's binary as processes.
func startJobCluster(t *testing.T, args ...string) *Cluster {
	t.Helper()

	full := append([]string{"--control-planes", "3", "--workers", "2", "--kubernetes", "v1.35.4", "--talos", "v1.13.9",
		"--image", "ghcr.io/ichor-dev/kubectl-ichor=" + jobImageRoot(t)}, args...)

	return startCluster(t, full...)
}

// ichor runs the plugin against c with the admin kubeconfig and talosconfig, for at
// most timeout.
func (c *Cluster) ichor(t *testing.T, timeout time.Duration, args ...string) pluginResult {
	t.Helper()

	r, err := c.runIchor(env(t, "ICHOR_PLUGIN"), cleanEnv(t, nil), timeout, args...)
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, r.stdout, r.stderr)
	}

	t.Logf("kubectl-ichor %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)

	return r
}

// runIchor runs plugin against c in environ for at most timeout, and says what went
// wrong instead of failing a test (a non-zero exit is the result's code, not an error).
func (c *Cluster) runIchor(plugin string, environ []string, timeout time.Duration, args ...string) (pluginResult, error) {
	full := append(append([]string{}, args...), "--kubeconfig", c.Kubeconfig, "--talosconfig", c.Talosconfig)

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	cmd := exec.CommandContext(ctx, plugin, full...)
	cmd.Env = environ

	var stdout, stderr bytes.Buffer

	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := pluginResult{args: args, stdout: stdout.String(), stderr: stderr.String()}

	var exit *exec.ExitError

	switch {
	case ctx.Err() != nil:
		return r, fmt.Errorf("kubectl-ichor %s: not done after %s", strings.Join(args, " "), timeout)
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		return r, fmt.Errorf("run kubectl-ichor %s: %w", strings.Join(args, " "), err)
	}

	return r, nil
}

// control is the operator's handle on c's operations, for the tests' own reads.
func (c *Cluster) control() *job.Control {
	return &job.Control{Kube: c.Client, Namespace: jobNamespace}
}

func (c *Cluster) operation(t *testing.T) *api.Operation {
	t.Helper()

	op, err := c.control().Get(context.Background())
	require.NoError(t, err)

	return op
}

// statusDocument reads the operation as `kubectl ichor status -o json` prints it.
func (c *Cluster) statusDocument(t *testing.T) (api.Operation, map[string]any) {
	t.Helper()

	r := c.ichor(t, time.Minute, "status", "-o", "json")
	r.requireExit(t, 0)

	var op api.Operation
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &op))

	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &raw))

	return op, raw
}

// requireNothingCordoned checks that no node is unschedulable or carries ichor's mark.
func requireNothingCordoned(t *testing.T, c *Cluster) {
	t.Helper()

	nodes, err := c.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)

	for _, n := range nodes.Items {
		assert.False(t, n.Spec.Unschedulable, "%s is cordoned", n.Name)
		assert.False(t, kube.CordonedByIchor(&n), "%s has ichor's cordon mark", n.Name)
	}
}

func lockHolder(t *testing.T, c *Cluster) string {
	t.Helper()

	l, err := c.Client.CoordinationV1().Leases(job.LockNamespace).Get(context.Background(), job.LockName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}

	require.NoError(t, err)

	if l.Spec.HolderIdentity == nil {
		return ""
	}

	return *l.Spec.HolderIdentity
}

// operationJobs are the Jobs of an operation, by name.
func operationJobs(t *testing.T, c *Cluster, id string) []batchv1.Job {
	t.Helper()

	list, err := c.Client.BatchV1().Jobs(jobNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: job.LabelOperation + "=" + id})
	require.NoError(t, err)

	return list.Items
}

// kubeletOrder is the order in which the kubelets reached target.
func kubeletOrder(evs []events.Event, target string) []string {
	var out []string

	for _, e := range evs {
		if e.Component == events.Kubelet && e.Version == target && !slices.Contains(out, e.Node) {
			out = append(out, e.Node)
		}
	}

	return out
}

// withLast moves node to the end of list, if it is in it.
func withLast(list []string, node string) []string {
	i := slices.Index(list, node)
	if i < 0 {
		return list
	}

	out := append(slices.Clone(list[:i]), list[i+1:]...)

	return append(out, node)
}

// TestJobUpgrade runs a full 3+2 upgrade from v1.35.4 to v1.36.3 through the Job, the
// runner using only its own ServiceAccount: the node that runs the Job goes last in its
// group, its drain evicts the runner, and a new pod finishes the upgrade from the state
// ConfigMap.
func TestJobUpgrade(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t)
	addWorkload(t, c, 2)

	ctx := context.Background()
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	// The node of the first runner pod, seen while the upgrade runs.
	firstNode := make(chan string, 1)
	watchCtx, stopWatch := context.WithCancel(ctx)

	defer stopWatch()

	go func() {
		for watchCtx.Err() == nil {
			pods, err := c.Client.CoreV1().Pods(jobNamespace).List(watchCtx, metav1.ListOptions{LabelSelector: job.LabelOperation})
			if err == nil {
				for _, p := range pods.Items {
					if p.Spec.NodeName != "" {
						firstNode <- p.Spec.NodeName

						return
					}
				}
			}

			time.Sleep(100 * time.Millisecond)
		}
	}()

	start := time.Now()
	r := c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 0)
	t.Logf("upgraded 3+2 from v1.35.4 to v1.36.3 through the Job in %s", time.Since(start).Round(time.Millisecond))

	require.Contains(t, r.stdout, "Stage 4/4 Kubelets", "the plan first")
	require.Contains(t, r.stdout, "Launched operation kubernetes-v1-36-3-")
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)
	require.Regexp(t, `(?m)^Overall \d+/14 node steps, \S+ elapsed, about \S+ left$`, r.stdout, "an estimate once batches were measured")

	var self string
	select {
	case self = <-firstNode:
	case <-time.After(10 * time.Second):
		t.Fatal("never saw the runner's node")
	}

	t.Logf("the first runner ran on %s", self)

	op, raw := c.statusDocument(t)
	assert.Equal(t, "Succeeded", raw["status"].(map[string]any)["phase"])

	prog, ok := raw["progress"].(map[string]any)
	require.True(t, ok, "status -o json carries the progress")
	assert.EqualValues(t, 14, prog["total"], "3 + 3 + 3 + 5 node steps")
	assert.EqualValues(t, 14, prog["done"])
	assert.Nil(t, prog["remainingSeconds"], "no estimate once ended")
	assert.Equal(t, api.PhaseSucceeded, op.Status.Phase)
	assert.Equal(t, 1, op.Status.Runs, "one runner: it stayed on its node through that node's drain and kubelet restart")
	assert.Equal(t, 4, op.Status.StageIndex)
	assert.NotNil(t, op.Status.FinishedAt)

	// The last runner exits once it wrote Succeeded; then the Job completes.
	eventually(t, time.Minute, "the Job Complete", func(context.Context) error {
		jobs := operationJobs(t, c, op.Spec.ID)
		if len(jobs) != 1 || jobs[0].Status.Succeeded != 1 {
			return fmt.Errorf("jobs %d", len(jobs))
		}

		return nil
	})

	jobs := operationJobs(t, c, op.Spec.ID)
	assert.Zero(t, jobs[0].Status.Failed, "no runner pod failed")
	assert.Equal(t, "", lockHolder(t, c), "the lock is released")

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)

	evs := c.Events(t)
	assert.Empty(t, invariantBreaks(evs))

	// The runner's node went last in its group (control planes, then workers).
	cps := withLast(controlPlanes, self)
	order := kubeletOrder(evs, "v1.36.3")
	require.Len(t, order, 5)
	assert.Equal(t, cps, order[:3], "control planes, the runner's node last")

	if !slices.Contains(controlPlanes, self) {
		assert.Equal(t, self, order[4], "the runner's worker last")
	}

	requireEventOrder(t, evs, "v1.36.3", cps, order)

	// The runner's log, through the API: its own node drained with it kept.
	r = c.ichor(t, time.Minute, "logs")
	r.requireExit(t, 0)
	assert.Contains(t, r.stdout, "took the lock: operation "+op.Spec.ID+" is Running (run 1")
	assert.NotContains(t, r.stdout, "(run 2")
	assert.Regexp(t, regexp.QuoteMeta(self)+` \w+: draining \(bound [^)]*\); the runner's own pod `+jobNamespace+`/`, r.stdout, "the runner kept on its own node through its drain")
	assert.Contains(t, r.stdout, "operation "+op.Spec.ID+" Succeeded")

	// A Kubernetes event for each step: nodes' in default, the operation's in its namespace.
	nodeEvents, err := c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,source=" + job.AppName})
	require.NoError(t, err)
	assert.NotEmpty(t, nodeEvents.Items)

	opEvents, err := c.Client.CoreV1().Events(jobNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + job.StateName})
	require.NoError(t, err)

	var reasons []string
	for _, e := range opEvents.Items {
		reasons = append(reasons, e.Reason)
	}

	assert.Contains(t, reasons, "Stage")
	assert.Contains(t, reasons, "Succeeded")

	// Its credentials are gone (TestJobLeastPrivilege checks what they allowed).
	requireNoCredentialLeft(t, c, api.PhaseSucceeded)

	// The state holds the operation and its plan gzipped; status reads both (the
	// plan says what changed on each node).
	state, err := c.Client.CoreV1().ConfigMaps(jobNamespace).Get(ctx, job.StateName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Empty(t, state.Data, "all in binaryData")

	plan, err := job.StatePlan(state)
	require.NoError(t, err)
	assert.Contains(t, string(plan), `"kind":"Plan"`)

	r = c.ichor(t, time.Minute, "status", "--operation", op.Spec.ID)
	r.requireExit(t, 0)
	assert.Contains(t, r.stdout, "; changed kubelet")

	// A plan that cannot be unpacked is said on one line, with what to do.
	state.BinaryData[job.PlanKey] = []byte("not gzipped at all")
	_, err = c.Client.CoreV1().ConfigMaps(jobNamespace).Update(ctx, state, metav1.UpdateOptions{})
	require.NoError(t, err)

	r = c.ichor(t, time.Minute, "status")
	assert.NotZero(t, r.code)
	r.requireOneLineError(t, "state configmap "+jobNamespace+"/"+job.StateName+" is corrupted (plan.json.gz: gzip: invalid header): "+
		"stop any upgrade Job with kubectl ichor abort")
}

// TestJobLockAbortAndTakeOver launches two upgrades at once (one is refused), refuses a
// third naming the lock's holder, reads the status document, aborts midway through the
// Kubelets stage (no node left cordoned, the lock released, the state kept), then lets a
// new upgrade take a lock whose holder is gone and finish.
func TestJobLockAbortAndTakeOver(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t)
	addWorkload(t, c, 2)

	ctx := context.Background()
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	// Two upgrades at once: one launches, the other is refused.
	var (
		wg      sync.WaitGroup
		results [2]pluginResult
	)

	for i := range results {
		wg.Add(1)

		go func() {
			defer wg.Done()

			results[i] = c.ichor(t, 3*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--detach")
		}()
	}

	wg.Wait()

	codes := []int{results[0].code, results[1].code}
	slices.Sort(codes)
	require.Equal(t, []int{0, 1}, codes, "exactly one upgrade launches")

	refused := results[0]
	if refused.code == 0 {
		refused = results[1]
	}

	refused.requireOneLineError(t, "error: operation kubernetes-v1-36-3-")
	require.Regexp(t, `launched \d+s ago\) (is being launched|is starting in job ichor-system/ichor-kubernetes-v1-36-3-\w+-1|holds the lock)`, refused.stderr)

	first := c.operation(t)

	// Running: the status document, and a third upgrade refused naming the holder.
	eventually(t, 2*time.Minute, "the operation Running", func(ctx context.Context) error {
		if op := c.operation(t); op.Status.Phase != api.PhaseRunning {
			return fmt.Errorf("phase %s", op.Status.Phase)
		}

		return nil
	})

	op, raw := c.statusDocument(t)
	assert.Equal(t, "ichor.dev/v1alpha1", raw["apiVersion"])
	assert.Equal(t, "Operation", raw["kind"])
	assert.Equal(t, "Running", raw["status"].(map[string]any)["phase"])
	assert.Equal(t, first.Spec.ID, op.Spec.ID)
	require.NotEmpty(t, op.Status.Runner)

	r := c.ichor(t, time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 1)
	r.requireOneLineError(t, "holds the lock lease kube-system/ichor-lock (holder: pod "+lockHolder(t, c)+")")
	require.Contains(t, r.stderr, "operation "+first.Spec.ID+" (Running, launched ")
	require.Empty(t, r.stdout, "refused before planning")

	// Abort midway: once the engine has cordoned a node in the Kubelets stage.
	eventually(t, 5*time.Minute, "a node cordoned by ichor", func(ctx context.Context) error {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}

		for _, n := range nodes.Items {
			if kube.CordonedByIchor(&n) {
				return nil
			}
		}

		return errors.New("none yet")
	})

	r = c.ichor(t, 3*time.Minute, "abort")
	r.requireExit(t, 0)
	require.Contains(t, r.stdout, "Aborted operation "+first.Spec.ID+" (it was Running)")
	require.Contains(t, r.stdout, "  uncordoned ")
	require.Contains(t, r.stdout, "the state stays in configmap ichor-system/ichor-state for the record")

	requireNothingCordoned(t, c)
	assert.Equal(t, "", lockHolder(t, c), "the lock is released")
	assert.Empty(t, operationJobs(t, c, first.Spec.ID), "the Job is stopped")

	op, _ = c.statusDocument(t)
	assert.Equal(t, api.PhaseAborted, op.Status.Phase)
	assert.Equal(t, first.Spec.ID, op.Spec.ID, "the state is kept for the record")
	assert.Empty(t, invariantBreaks(c.Events(t)), "an abort breaks no invariant")

	// The node the abort caught restarting its kubelet comes back Ready, its static pods
	// restarted by the new kubelet shown again (the next plan refuses a NotReady node
	// and an apiserver without a mirror pod).
	waitSettled(t, c)

	// A lock whose holder is gone does not stop the next upgrade: its runner takes it.
	lease, err := c.Client.CoordinationV1().Leases(job.LockNamespace).Get(ctx, job.LockName, metav1.GetOptions{})
	require.NoError(t, err)

	ghost, now := jobNamespace+"/ichor-kubernetes-v1-36-3-ghost-1-xxxxx", metav1.NewMicroTime(time.Now())
	lease.Spec.HolderIdentity, lease.Spec.RenewTime = &ghost, &now
	_, err = c.Client.CoordinationV1().Leases(job.LockNamespace).Update(ctx, lease, metav1.UpdateOptions{})
	require.NoError(t, err)

	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	second := c.operation(t)
	require.NotEqual(t, first.Spec.ID, second.Spec.ID)

	// The runner took the ghost's lock over at once rather than waiting a full lease
	// duration (15s) from its first look.
	require.NotNil(t, second.Status.StartedAt)
	took := second.Status.StartedAt.Sub(second.Spec.CreatedAt.Time)
	t.Logf("the runner took the lock %s after the launch", took)
	assert.Less(t, took, job.LeaseDuration-3*time.Second)

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))

	// In a namespace Talos does not allow, it refuses the Job's credentials, and says why.
	r = c.ichor(t, 3*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "-n", "upgrades")
	r.requireExit(t, 1)
	r.requireOneLineError(t, "talos did not write the credentials of talos.dev ServiceAccount upgrades/ichor-talos in ")
	require.Contains(t, r.stderr, `(Talos says: namespace "upgrades" is not in allowedKubernetesNamespaces)`)
	require.Contains(t, r.stderr, "with role os:admin and namespace upgrades")
}

// TestJobPauseAndResume: an apply that blocks on cp-2 pauses the operation (the Job
// fails at once, no retry) with what to do; once the fault is cleared, resume finishes.
func TestJobPauseAndResume(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, nil, 0o644))

	c := startJobCluster(t, "--faults", faults)
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	require.NoError(t, os.WriteFile(faults, []byte("nodes:\n  cp-2:\n    applyBlocks: true\n"), 0o644))

	r := c.ichor(t, 5*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--apply-timeout", "5s")
	r.requireExit(t, job.ExitPaused)
	r.requireOneLineError(t, "paused: APIServers cp-2: ")
	require.Contains(t, r.stdout, "Paused: APIServers cp-2: ")
	require.Contains(t, r.stdout, "  what to do: ")

	op, raw := c.statusDocument(t)
	assert.Equal(t, "Paused", raw["status"].(map[string]any)["phase"])
	assert.Equal(t, "cp-2", op.Status.PausedNode)
	assert.NotEmpty(t, op.Status.Reason)
	assert.NotEmpty(t, op.Status.Action)

	// The runner exited ExitPaused: the Job fails at once by its podFailurePolicy.
	eventually(t, time.Minute, "the Job Failed by its podFailurePolicy", func(context.Context) error {
		for _, j := range operationJobs(t, c, op.Spec.ID) {
			for _, cond := range j.Status.Conditions {
				if cond.Type == batchv1.JobFailed && cond.Status == corev1.ConditionTrue {
					if cond.Reason != batchv1.JobReasonPodFailurePolicy {
						return fmt.Errorf("failed for %s: %s", cond.Reason, cond.Message)
					}

					return nil
				}
			}
		}

		return errors.New("not failed yet")
	})

	jobs := operationJobs(t, c, op.Spec.ID)
	require.Len(t, jobs, 1)
	assert.Equal(t, int32(1), jobs[0].Status.Failed, "one pod, no retry of a pause")
	assert.Equal(t, "", lockHolder(t, c))

	// A second upgrade is refused while it is paused.
	r = c.ichor(t, time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireOneLineError(t, "is paused: ")
	require.Contains(t, r.stderr, "continue it with kubectl ichor resume")

	require.NoError(t, os.WriteFile(faults, nil, 0o644))

	r = c.ichor(t, 10*time.Minute, "resume")
	r.requireExit(t, 0)
	require.Contains(t, r.stdout, "Resumed operation "+op.Spec.ID+": job ichor-system/"+job.JobName(op.Spec.ID, 2))
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	final := c.operation(t)
	assert.Equal(t, api.PhaseSucceeded, final.Status.Phase)
	assert.Equal(t, 2, final.Status.Attempt)

	// The state keeps what the estimate of the time left is made of: each
	// runner's start and end (the one after the resume waited for the
	// operator, not for a replacement), the stages' own steps.
	require.GreaterOrEqual(t, len(final.Status.Runners), 2)
	assert.NotNil(t, final.Status.Runners[0].Ended, "the paused runner's end")
	assert.True(t, final.Status.Runners[1].AfterPause, "the runner after the resume")
	rollout := final.Status.StepOf("KubeProxy", engine.StepRollout)
	require.NotNil(t, rollout, "the kube-proxy rollout is timed")
	assert.NotNil(t, rollout.Done)
	assert.Positive(t, rollout.Pods)
	assert.Equal(t, rollout.Pods, rollout.Updated)

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}

// TestJobRunnerKilled deletes the runner's pod with no grace period at 20 random points,
// half of them in the Kubelets stage (each time the operator resumes once it is gone);
// the upgrade still completes, with the invariant intact and no node left cordoned.
func TestJobRunnerKilled(t *testing.T) {
	t.Parallel()

	// Slower restarts than the default, so that twenty kills fit in the
	// upgrade however quick the runner gets.
	c := startJobCluster(t, "--kubelet-restart", "10s", "--static-pod-restart", "6s")
	addWorkload(t, c, 2)

	ctx := context.Background()
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("kill points from seed %d", seed)

	r := c.ichor(t, 3*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--detach")
	r.requireExit(t, 0)

	const kills = 20

	killed := 0
	zero := int64(0)

	for killed < kills {
		holder := waitForRunner(t, c)
		if holder == "" {
			break // succeeded
		}

		// The second half of the kills lands in the Kubelets stage, where nodes are
		// cordoned and drained.
		if killed >= kills/2 {
			for op := c.operation(t); op.Status.Stage != "Kubelets" && op.Status.Phase == api.PhaseRunning; op = c.operation(t) {
				time.Sleep(100 * time.Millisecond)
			}
		}

		// Short enough that twenty kills fall inside the upgrade: each new runner
		// only gets this long before the next kill.
		time.Sleep(time.Duration(200+rng.IntN(1600)) * time.Millisecond)

		op := c.operation(t)
		if op.Status.Phase == api.PhaseSucceeded {
			break
		}

		err := c.Client.CoreV1().Pods(jobNamespace).Delete(ctx, holder, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if apierrors.IsNotFound(err) {
			continue
		}

		require.NoError(t, err)

		killed++

		node := "?"
		if n := op.Status.Node(lastNode(op)); n != nil {
			node = fmt.Sprintf("%s %s %s", n.Stage, n.Name, n.Phase)
		}

		t.Logf("kill %d: pod %s at stage %s (last step: %s)", killed, holder, op.Status.Stage, node)

		eventually(t, time.Minute, "the killed runner gone", func(ctx context.Context) error {
			p, err := c.Client.CoreV1().Pods(jobNamespace).Get(ctx, holder, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded)) {
				return nil
			}

			return fmt.Errorf("pod %s still there (%v)", holder, err)
		})

		// The operator resumes; when the Job was quicker with a new pod, there is
		// nothing to resume.
		r := c.ichor(t, 3*time.Minute, "resume", "--detach")
		if r.code != 0 {
			r.requireOneLineError(t, "nothing to resume")
		}
	}

	t.Logf("killed the runner %d times", killed)
	require.Equal(t, kills, killed, "the upgrade ended before every kill")

	r = c.ichor(t, 10*time.Minute, "status", "--watch")
	r.requireExit(t, 0)

	op := c.operation(t)
	assert.Equal(t, api.PhaseSucceeded, op.Status.Phase)
	t.Logf("%d runner pods in %d Jobs took the lock", op.Status.Runs, op.Status.Attempt)

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}

// waitForRunner returns the pod that holds the lock and runs, "" once the operation
// succeeded. When no runner shows up for a while (the Job's backoff), it resumes.
// lockHolderPod is the pod of the lock's holder (<namespace>/<pod>) in the
// product's namespace, "" when nobody holds it or a runner of another
// namespace does.
func lockHolderPod(t *testing.T, c *Cluster) string {
	t.Helper()

	ns, pod, found := strings.Cut(lockHolder(t, c), "/")
	if !found || ns != jobNamespace {
		return ""
	}

	return pod
}

func waitForRunner(t *testing.T, c *Cluster) string {
	t.Helper()

	ctx := context.Background()
	deadline := time.Now().Add(3 * time.Minute)
	idleSince := time.Now()

	for time.Now().Before(deadline) {
		op := c.operation(t)

		switch op.Status.Phase {
		case api.PhaseSucceeded:
			return ""
		case api.PhasePaused, api.PhaseAborted:
			t.Fatalf("operation %s %s: %s", op.Spec.ID, op.Status.Phase, op.Status.Reason)
		}

		if holder := lockHolderPod(t, c); holder != "" && holder == op.Status.Runner && op.Status.Phase == api.PhaseRunning {
			if p, err := c.Client.CoreV1().Pods(jobNamespace).Get(ctx, holder, metav1.GetOptions{}); err == nil && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				return holder
			}
		}

		if time.Since(idleSince) > 20*time.Second {
			r := c.ichor(t, 3*time.Minute, "resume", "--detach")
			if r.code != 0 {
				r.requireOneLineError(t, "nothing to resume")
			}

			idleSince = time.Now()
		}

		time.Sleep(100 * time.Millisecond)
	}

	t.Fatal("no runner took the lock in 3m")

	return ""
}

// lastNode is the node whose step changed last.
func lastNode(op *api.Operation) string {
	var (
		name string
		at   time.Time
	)

	for _, n := range op.Status.Nodes {
		if !n.Since.Time.Before(at) {
			name, at = n.Name, n.Since.Time
		}
	}

	return name
}

// TestJobLocalCredentials: without kubernetesTalosAPIAccess Talos refuses the Job's
// ServiceAccount and the launch says what to do, changing nothing; with
// --talos-credentials=local the Job runs on a copy of the operator's talosconfig,
// which is deleted once the operation succeeded.
func TestJobLocalCredentials(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, "--talos-api-access=false")
	ctx := context.Background()

	r := c.ichor(t, 3*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 1)
	r.requireOneLineError(t, "the cluster does not serve talos.dev ServiceAccounts (Talos' Kubernetes API access is off): "+
		"enable machine.features.kubernetesTalosAPIAccess on the control planes with role os:admin and namespace ichor-system")
	require.Contains(t, r.stderr, "or pass --talos-credentials=local")
	require.Regexp(t, `(?m)^talos access for job\s+WARN`, r.stdout, "the plan said so first")

	op := c.operation(t)
	assert.Equal(t, api.PhaseAborted, op.Status.Phase, "a failed launch blocks no later one")
	assert.Contains(t, op.Status.Reason, "launch failed: the cluster does not serve talos.dev ServiceAccounts")
	assert.Empty(t, operationJobs(t, c, op.Spec.ID), "no Job without credentials")

	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--talos-credentials=local")
	r.requireExit(t, 0)
	require.Contains(t, r.stderr, "warning: --talos-credentials=local copies your talosconfig")
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	op = c.operation(t)
	assert.Equal(t, api.PhaseSucceeded, op.Status.Phase)
	assert.Equal(t, api.CredentialsLocal, op.Spec.Credentials)

	_, err := c.Client.CoreV1().Secrets(jobNamespace).Get(ctx, job.LocalTalosconfigName, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the copied talosconfig is deleted once the operation ends: %v", err)
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}

// TestJobOneOperationPerCluster runs an upgrade in the default namespace and refuses a
// second one in another namespace, naming the first's lock holder (the lock is the
// cluster's, in kube-system, whatever -n says); once the first is aborted, the second
// runs in its own namespace through the same lock and finishes.
func TestJobOneOperationPerCluster(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t)
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	r := c.ichor(t, 3*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--detach")
	r.requireExit(t, 0)

	first := c.operation(t)

	eventually(t, 2*time.Minute, "the first operation holding the lock", func(ctx context.Context) error {
		if h := lockHolder(t, c); !strings.HasPrefix(h, jobNamespace+"/") {
			return fmt.Errorf("holder %q", h)
		}

		return nil
	})

	holder := lockHolder(t, c)

	r = c.ichor(t, 3*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "-n", "upgrades", "--talos-credentials", "local")
	r.requireExit(t, 1)
	r.requireOneLineError(t, "error: operation "+first.Spec.ID+" in namespace ichor-system (Running, launched ")
	require.Contains(t, r.stderr, "holds the lock lease kube-system/ichor-lock (holder: pod "+holder+"): one operation per cluster")
	require.Empty(t, r.stdout, "refused before planning")

	_, err := (&job.Control{Kube: c.Client, Namespace: "upgrades"}).Get(context.Background())
	require.ErrorIs(t, err, job.ErrNoOperation, "nothing was launched in namespace upgrades")

	r = c.ichor(t, 3*time.Minute, "abort")
	r.requireExit(t, 0)
	assert.Equal(t, "", lockHolder(t, c), "the lock is released")

	waitSettled(t, c)

	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "-n", "upgrades", "--talos-credentials", "local")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	op, err := (&job.Control{Kube: c.Client, Namespace: "upgrades"}).Get(context.Background())
	require.NoError(t, err)
	assert.Equal(t, api.PhaseSucceeded, op.Status.Phase)
	assert.Equal(t, "", lockHolder(t, c), "the lock is released")

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}

// waitSettled waits until every node is Ready and each control plane's static pods show
// Ready under mirror pods created since its kubelet last started (events.jsonl): after an
// abort that caught a kubelet restarting on a new version, which deletes its mirror pods
// once Ready and creates them again (a plan refuses a NotReady node and an apiserver
// without a mirror pod; a count of Ready mirror pods passed in the moment before the
// deletion). A kubelet's first start in a boot creates its mirror pods before its node is
// Ready (its runtime and network still coming up), so the Ready transition is no mark.
func waitSettled(t *testing.T, c *Cluster) {
	t.Helper()

	eventually(t, 2*time.Minute, "every node Ready, every control plane's static pods Ready since its kubelet started", func(ctx context.Context) error {
		started := map[string]time.Time{}

		for _, e := range c.Events(t) {
			if e.Component == events.Kubelet && e.Time.After(started[e.Node]) {
				started[e.Node] = e.Time
			}
		}

		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}

		pods, err := c.Client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}

		byName := map[string]*corev1.Pod{}
		for i := range pods.Items {
			byName[pods.Items[i].Name] = &pods.Items[i]
		}

		for _, n := range nodes.Items {
			ready := readyCondition(&n)
			if ready == nil || ready.Status != corev1.ConditionTrue {
				return fmt.Errorf("%s not Ready", n.Name)
			}

			if _, ok := n.Labels[discovery.ControlPlaneLabel]; !ok {
				continue
			}

			for _, component := range discovery.StaticPodComponents() {
				name := string(component) + "-" + n.Name

				p, found := byName[name]
				switch {
				case !found:
					return fmt.Errorf("no mirror pod %s", name)
				case p.CreationTimestamp.Time.Before(started[n.Name].Truncate(time.Second)): // the timestamp is in seconds
					return fmt.Errorf("mirror pod %s is older than %s's kubelet (started %s)", name, n.Name, started[n.Name].Format(time.RFC3339Nano))
				case !kube.PodReady(p):
					return fmt.Errorf("mirror pod %s not Ready", name)
				}
			}
		}

		return nil
	})
}

func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}

	return nil
}

// TestJobRunnerNodeLost cuts the power of the node the runner runs on, for good as far
// as Kubernetes can tell: the Job replaces only a failed pod, and the runner's pod on
// a node that stopped answering is never failed by anyone. `status` says so, with the
// operator's way out (the node marked out of service); the operator takes it, the Job
// starts another runner without a resume, and once the node is back the upgrade ends
// with every node on the target.
func TestJobRunnerNodeLost(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, nil, 0o644))

	c := startJobCluster(t, "--faults", faults)
	ctx := context.Background()
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	r := c.ichor(t, 3*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--detach")
	r.requireExit(t, 0)

	holder := waitForRunner(t, c)
	require.NotEmpty(t, holder, "the upgrade ended before its runner could be lost")

	pod, err := c.Client.CoreV1().Pods(jobNamespace).Get(ctx, holder, metav1.GetOptions{})
	require.NoError(t, err)

	lost := pod.Spec.NodeName
	require.NoError(t, os.WriteFile(faults, fmt.Appendf(nil, "nodes:\n  %s:\n    poweredOff: true\n", lost), 0o644))
	t.Logf("powered off %s, where runner %s runs", lost, holder)

	// The node lifecycle controller marks the node Unknown after its grace; status
	// then says what became of the runner and what to do.
	taint := "kubectl taint node " + lost + " node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"

	eventually(t, 3*time.Minute, "status naming the lost node", func(context.Context) error {
		r := c.ichor(t, time.Minute, "status")
		if out := r.stdout + r.stderr; !strings.Contains(out, "runner pod "+holder+" is on node "+lost+", not Ready") || !strings.Contains(out, taint) {
			return fmt.Errorf("status says:\n%s", out)
		}

		return nil
	})

	require.NoError(t, setTaint(ctx, c, lost, corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}, true))

	// The pod garbage collector fails and deletes the pod; the Job starts another
	// runner, with no resume.
	eventually(t, 3*time.Minute, "another runner holding the lock", func(ctx context.Context) error {
		if now := lockHolderPod(t, c); now != "" && now != holder {
			p, err := c.Client.CoreV1().Pods(jobNamespace).Get(ctx, now, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning {
				return nil
			}
		}

		if op := c.operation(t); op.Status.Phase != api.PhaseRunning {
			return fmt.Errorf("operation %s: %s", op.Status.Phase, op.Status.Reason)
		}

		return fmt.Errorf("lock held by %q", lockHolderPod(t, c))
	})

	// The node comes back; the operator lifts the taint, and resumes should the
	// upgrade have paused on the node meanwhile.
	require.NoError(t, os.WriteFile(faults, nil, 0o644))
	eventually(t, 3*time.Minute, lost+" Ready again", func(ctx context.Context) error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, lost, metav1.GetOptions{})
		if err != nil {
			return err
		}

		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}

		return errors.New("not Ready")
	})
	require.NoError(t, setTaint(ctx, c, lost, corev1.Taint{Key: corev1.TaintNodeOutOfService, Effect: corev1.TaintEffectNoExecute}, false))

	for resumes := 0; ; resumes++ {
		r := c.ichor(t, 10*time.Minute, "status", "--watch")
		if r.code == 0 {
			break
		}

		op := c.operation(t)
		require.Equal(t, api.PhasePaused, op.Status.Phase, "status --watch exit %d:\n%s\n%s", r.code, r.stdout, r.stderr)
		require.Less(t, resumes, 2, "paused again: %s", op.Status.Reason)
		t.Logf("paused: %s; resuming", op.Status.Reason)
		c.ichor(t, 3*time.Minute, "resume", "--detach").requireExit(t, 0)
	}

	op := c.operation(t)
	assert.Equal(t, api.PhaseSucceeded, op.Status.Phase)
	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}

// setTaint adds taint to node (on), or removes every taint of its key and effect.
func setTaint(ctx context.Context, c *Cluster, node string, taint corev1.Taint, on bool) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}

		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == taint.Key && t.Effect == taint.Effect })
		if on {
			n.Spec.Taints = append(n.Spec.Taints, taint)
		}

		_, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})

		return err
	})
}

// TestJobRunnerRestartedByItsKubelet: a Kubernetes upgrade's runner stays on its
// node through that node's drain and kubelet restart, which Kubernetes does not
// promise to leave running: a kubelet whose container hash changed with its version
// (v1.31's did) restarts every container of its pods, the runner's among them. One pod,
// no failed pod, no Job backoff, and the Job ends, in either order the kubelet takes:
//   - the restart comes before the runner sees its node Ready: the runner starts again
//     in the same pod, takes the lock again and finishes from the state (Runs 2);
//   - it comes after the runner wrote Succeeded and removed its credentials: the
//     container starts without them (their Secret is optional, the ServiceAccount
//     kept), finds the operation ended and exits 0 (Runs 1).
//
// Which order a run takes is the kubelet's; the second is then made sure of: a
// runner's pod started after the end, as the late restart starts it, ends the Job.
func TestJobRunnerRestartedByItsKubelet(t *testing.T) {
	t.Parallel()

	var faults strings.Builder

	faults.WriteString("nodes:\n")

	for _, n := range allNodes {
		fmt.Fprintf(&faults, "  %s:\n    restartsContainers: true\n", n)
	}

	path := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(path, []byte(faults.String()), 0o644))

	c := startJobCluster(t, "--faults", path)
	ctx := context.Background()
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	r := c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 0)
	assert.NotContains(t, r.stderr, "has not ended", "the runner's Job ended")

	op := c.operation(t)
	require.Equal(t, api.PhaseSucceeded, op.Status.Phase)

	pods, err := c.Client.CoreV1().Pods(jobNamespace).List(ctx, metav1.ListOptions{LabelSelector: job.LabelOperation + "=" + op.Spec.ID})
	require.NoError(t, err)
	require.Len(t, pods.Items, 1, "one runner pod: its container restarted in it")

	p := pods.Items[0]
	require.Len(t, p.Status.ContainerStatuses, 1)
	assert.GreaterOrEqual(t, p.Status.ContainerStatuses[0].RestartCount, int32(1), "the runner's container restarted in its pod")
	assert.Equal(t, corev1.PodSucceeded, p.Status.Phase)

	logs, err := c.Client.CoreV1().Pods(jobNamespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	require.NoError(t, err)

	if op.Status.Runs < 2 {
		t.Logf("the kubelet restarted the runner after the operation's end")
		assert.Regexp(t, "operation "+op.Spec.ID+" (ended: its runner's credentials were removed; nothing to do|already succeeded)", string(logs),
			"the container restarted after the end exited at once")
	} else {
		t.Logf("the kubelet restarted the runner before the operation's end: runs %d", op.Status.Runs)
	}

	// The Job controller counts the pod a sync after it ended (up to its batch period).
	jobComplete := func(name string) {
		t.Helper()
		eventually(t, 2*time.Minute, "job "+name+" complete", func(ctx context.Context) error {
			j, err := c.Client.BatchV1().Jobs(jobNamespace).Get(ctx, name, metav1.GetOptions{})
			switch {
			case err != nil:
				return err
			case j.Status.Failed > 0:
				return fmt.Errorf("a pod failed: %+v", j.Status)
			case j.Status.Succeeded != 1:
				return fmt.Errorf("not complete: %+v", j.Status)
			}

			return nil
		})
	}

	jobs := operationJobs(t, c, op.Spec.ID)
	require.Len(t, jobs, 1)
	jobComplete(jobs[0].Name)

	requireNoCredentialLeft(t, c, api.PhaseSucceeded)

	// The late restart, made sure of: a pod of the runner's Job started now, with its
	// credentials removed, starts, says the operation ended and ends its Job.
	late := job.Job(job.JobParams{Namespace: jobNamespace, Operation: op.Spec.ID, Attempt: op.Status.Attempt + 1, Image: op.Spec.Image, Credentials: op.Spec.Credentials})
	_, err = c.Client.BatchV1().Jobs(jobNamespace).Create(ctx, late, metav1.CreateOptions{})
	require.NoError(t, err)

	jobComplete(late.Name)

	latePods, err := c.Client.CoreV1().Pods(jobNamespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + late.Name})
	require.NoError(t, err)
	require.Len(t, latePods.Items, 1)

	logs, err = c.Client.CoreV1().Pods(jobNamespace).GetLogs(latePods.Items[0].Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	require.NoError(t, err)
	assert.Contains(t, string(logs), "operation "+op.Spec.ID+" ended: its runner's credentials were removed; nothing to do (kubectl ichor status says how it ended)")
	assert.Equal(t, api.PhaseSucceeded, c.operation(t).Status.Phase, "the state stays")

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}
