package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/progress"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
	"github.com/ichor-dev/kubectl-ichor/pkg/version"
)

var now0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// jobCluster is the cluster the commands of an operation see.
type jobCluster struct {
	kube   *fake.Clientset
	dyn    *dynamicfake.FakeDynamicClient
	engine job.Engine
	env    map[string]string
	// noTalosconfig: the run verb finds no talosconfig (its Secret not mounted).
	noTalosconfig bool
}

func newJobCluster(objs ...runtime.Object) *jobCluster {
	c := &jobCluster{
		kube: fake.NewClientset(objs...),
		dyn:  dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{job.TalosAccountResource: "ServiceAccountList"}),
		env:  map[string]string{"POD_NAME": "runner-pod", "NODE_NAME": "cp-2"},
	}

	// The dynamic fake's apply does not create: do what the apiserver does.
	c.dyn.PrependReactor("patch", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		u := &unstructured.Unstructured{}

		if err := u.UnmarshalJSON(p.GetPatch()); err != nil {
			return true, nil, err
		}

		_ = c.dyn.Tracker().Delete(job.TalosAccountResource, p.GetNamespace(), p.GetName())

		return true, u, c.dyn.Tracker().Create(job.TalosAccountResource, u, p.GetNamespace())
	})

	return c
}

// with adds the commands of an operation to d, against c.
func (c *jobCluster) with(d deps) deps {
	target := func(*genericclioptions.ConfigFlags) (*jobTarget, error) {
		return &jobTarget{kube: c.kube, dynamic: c.dyn}, nil
	}

	d.job = jobDeps{
		connect:   target,
		inCluster: target,
		engine: func(context.Context, job.EngineConfig) (job.Engine, func(), error) {
			return c.engine, nil, nil
		},
		terminal: func(any) bool { return false },
		now:      func() time.Time { return now0.Add(5 * time.Minute) },
		poll:     5 * time.Millisecond,
		env:      func(k string) string { return c.env[k] },
		talosconfig: func(string) (string, error) {
			if c.noTalosconfig {
				return "", &talos.NoTalosconfigError{Looked: []string{"/var/run/secrets/talos.dev/config: not found"}}
			}

			return "/var/run/secrets/talos.dev/config", nil
		},
		control: func(ctl *job.Control) {
			ctl.Poll, ctl.StopTimeout, ctl.CredentialsTimeout = 5*time.Millisecond, time.Second, 200*time.Millisecond
		},
	}

	return d
}

func operation(phase api.Phase) *api.Operation {
	op := api.NewOperation(api.OperationSpec{
		ID: "kubernetes-v1-36-3-abcde", Upgrade: api.UpgradeKubernetes, Target: "v1.36.3", MaxUnavailable: 2,
		Image: "ghcr.io/ichor-dev/kubectl-ichor:v0.1.0", Credentials: api.CredentialsServiceAccount,
		CreatedAt: metav1.NewTime(now0),
	})
	op.Status.Phase = phase
	op.Status.Attempt = 1
	op.Status.Job = job.JobName(op.Spec.ID, 1)
	op.Status.UpdatedAt = &metav1.Time{Time: now0}

	return op
}

func stateOf(t *testing.T, op *api.Operation, plan []byte) *corev1.ConfigMap {
	t.Helper()

	cm, err := job.EncodeState(job.DefaultNamespace, op, plan)
	require.NoError(t, err)

	return cm
}

func goldenPlan(t *testing.T) (*api.Plan, []byte) {
	t.Helper()

	raw, err := os.ReadFile(filepath.Join("testdata", "plan-kubernetes-json.golden"))
	require.NoError(t, err)

	var p api.Plan
	require.NoError(t, json.Unmarshal(raw, &p))

	return &p, raw
}

// kubeletsStage is an operation in its last stage: cp-1 to cp-3 done, worker-2 draining,
// worker-1 verifying.
func kubeletsStage(op *api.Operation) *api.Operation {
	s := &op.Status
	s.Phase, s.Runner, s.Runs = api.PhaseRunning, "ichor-kubernetes-v1-36-3-abcde-1-x7k2p", 2
	s.StartedAt = &metav1.Time{Time: now0.Add(10 * time.Second)}
	s.Stage, s.StageIndex, s.StageCount = "Kubelets", 4, 4

	for i, n := range []string{"cp-1", "cp-3", "cp-2"} {
		job.SetNode(s, "Kubelets", n, engine.PhaseDone, "drained 3 pod(s), node Ready, kubelet v1.36.3, uncordoned", now0.Add(time.Duration(i)*time.Minute))
	}

	job.SetNode(s, "Kubelets", "worker-2", engine.PhaseDraining, "evicting 2 pod(s)", now0.Add(4*time.Minute))
	job.SetNode(s, "KubeProxy", "worker-1", engine.PhaseDone, "", now0)

	return op
}

func TestViewFrames(t *testing.T) {
	plan, _ := goldenPlan(t)
	now := now0.Add(5 * time.Minute)

	paused := kubeletsStage(operation(api.PhaseRunning))
	paused.Status.Phase = api.PhasePaused
	job.SetNode(&paused.Status, "Kubelets", "worker-2", engine.PhaseFailed, "drain: pod default/web-0 not evicted after 5m0s", now)
	paused.Status.PausedNode = "worker-2"
	paused.Status.Reason = "drain: pod default/web-0 not evicted after 5m0s (PodDisruptionBudget default/web)"
	paused.Status.Action = "let default/web allow a disruption, then kubectl ichor resume"

	succeeded := kubeletsStage(operation(api.PhaseRunning))
	succeeded.Status.Phase = api.PhaseSucceeded
	succeeded.Status.FinishedAt = &metav1.Time{Time: now0.Add(12*time.Minute + 4*time.Second)}

	var b strings.Builder

	for _, v := range []view{
		{op: operation(api.PhasePending), plan: plan, now: now},
		{op: kubeletsStage(operation(api.PhaseRunning)), plan: plan, now: now},
		{op: kubeletsStage(operation(api.PhaseRunning)), now: now, problem: "pod x cannot start: ImagePullBackOff: back-off"},
		{op: paused, plan: plan, now: now},
		{op: succeeded, plan: plan, now: now},
	} {
		printOnce(&b, v)
		b.WriteString("\n")
	}

	golden(t, "status-views.golden", b.String())
}

func TestPlainFollowLines(t *testing.T) {
	plan, _ := goldenPlan(t)

	steps := []func(s *api.OperationStatus){
		func(*api.OperationStatus) {},
		func(s *api.OperationStatus) {
			s.Phase, s.Runner, s.Runs = api.PhaseRunning, "pod-1", 1
			s.Stage, s.StageIndex, s.StageCount = "APIServers", 1, 4
			job.SetNode(s, "APIServers", "cp-1", engine.PhaseApplying, "kube-apiserver v1.36.3", now0)
		},
		func(s *api.OperationStatus) {
			job.SetNode(s, "APIServers", "cp-1", engine.PhaseDone, "kube-apiserver v1.36.3 Ready", now0)
		},
		func(s *api.OperationStatus) {
			s.Runner, s.Runs = "pod-2", 2 // evicted, a new pod continues
			s.Stage, s.StageIndex = "KubeProxy", 3
			s.Step = "manifests: applied 10 objects"
		},
		func(s *api.OperationStatus) {
			s.Phase, s.Reason, s.Action, s.PausedNode = api.PhasePaused, "node NotReady after 20m0s", "look at its kubelet, then kubectl ichor resume", "cp-2"
		},
	}

	op := operation(api.PhasePending)
	prev := view{}

	var lines []string

	for _, step := range steps {
		next := *op

		b, err := json.Marshal(op.Status)
		require.NoError(t, err)

		next.Status = api.OperationStatus{}
		require.NoError(t, json.Unmarshal(b, &next.Status))
		step(&next.Status)

		cur := view{op: &next, plan: plan, now: now0}
		lines = append(lines, viewChanges(prev, cur)...)
		prev, op = cur, &next
	}

	golden(t, "follow-plain.golden", strings.Join(lines, "\n")+"\n")
}

func TestStatusDocument(t *testing.T) {
	c := newJobCluster(stateOf(t, kubeletsStage(operation(api.PhaseRunning)), nil))

	stdout, stderr, code := runWith(t, c.with(deps{}), "status", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)

	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &doc))
	assert.Equal(t, "ichor.dev/v1alpha1", doc["apiVersion"])
	assert.Equal(t, "Operation", doc["kind"])
	assert.Equal(t, "Running", doc["status"].(map[string]any)["phase"])

	stdout, _, code = runWith(t, c.with(deps{}), "status", "-o", "yaml")
	require.Equal(t, ExitOK, code)

	var op api.Operation
	require.NoError(t, yaml.Unmarshal([]byte(stdout), &op))
	assert.Equal(t, "Kubelets", op.Status.Stage)
}

func TestStatusDocumentCarriesProgress(t *testing.T) {
	_, raw := goldenPlan(t)
	c := newJobCluster(stateOf(t, kubeletsStage(operation(api.PhaseRunning)), raw))

	stdout, stderr, code := runWith(t, c.with(deps{}), "status", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)

	var doc struct {
		Status   api.OperationStatus `json:"status"`
		Progress progress.Progress   `json:"progress"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &doc))
	assert.Equal(t, "Kubelets", doc.Status.Stage)
	assert.Equal(t, 3+3+3+5, doc.Progress.Total, "every node of every stage of the plan")
	assert.Equal(t, 3, doc.Progress.Done, "three control planes in Kubelets (worker-1 is not in the plan's KubeProxy stage)")
	require.Len(t, doc.Progress.Stages, 4)
	// Two control-plane batches measured, whichever nodes they were (cp-3
	// done at 1m, then cp-2 at 2m: 50s from the runner's start at 10s, then
	// 60s); cp-1 was done before the runner started.
	assert.Equal(t, progress.Stage{Name: "Kubelets", Done: 3, Total: 5, Batches: 4, BatchSeconds: 60}, doc.Progress.Stages[3])
	require.NotNil(t, doc.Progress.RemainingSeconds, "batches measured: an estimate")
}

func TestStatusOfEndedOperations(t *testing.T) {
	_, raw := goldenPlan(t)
	ctx := context.Background()

	// op-1 ended with a pause on its way; op-2 replaced it and succeeded.
	first := kubeletsStage(operation(api.PhaseRunning))
	first.Spec.ID = "kubernetes-v1-36-3-first"
	first.Status.Phase = api.PhaseSucceeded
	first.Status.FinishedAt = &metav1.Time{Time: now0.Add(5 * time.Minute)}
	first.Status.AddPause("Kubelets", "worker-2", "drain: pod default/web-0 not evicted after 5m0s", now0.Add(3*time.Minute))

	second := operation(api.PhaseSucceeded)
	second.Status.FinishedAt = &metav1.Time{Time: now0.Add(time.Hour)}
	second.Status.Manifests = "applied 9 bootstrap manifest object(s) from cp-1; skipped 1 changed by another field manager: DaemonSet kube-system/kube-flannel"

	c := newJobCluster(stateOf(t, first, raw))
	store := &job.Store{Client: c.kube.CoreV1(), Namespace: job.DefaultNamespace}
	require.NoError(t, store.Create(ctx, second, raw, func(*api.Operation) error { return nil }))

	stdout, stderr, code := runWith(t, c.with(deps{}), "status")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Earlier (kubectl ichor status --operation <id>):\n  kubernetes-v1-36-3-first  Kubernetes to v1.36.3  Succeeded")
	assert.Contains(t, stdout, "\n  bootstrap manifests: "+second.Status.Manifests+"\nSucceeded in ", "what the sync left alone stays said")

	stdout, stderr, code = runWith(t, c.with(deps{}), "status", "--operation", "kubernetes-v1-36-3-first")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Operation kubernetes-v1-36-3-first: Kubernetes to v1.36.3  Succeeded")
	assert.Contains(t, stdout, "Nodes, each stage from its apply to done:")
	assert.Regexp(t, `\n  cp-1 +Kubelets not done|\n  cp-1 +Kubelets`, stdout)
	assert.Contains(t, stdout, "changed kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet")
	assert.Contains(t, stdout, "Pauses:\n  "+now0.Add(3*time.Minute).UTC().Format(time.DateTime)+"  Kubelets worker-2: drain: pod default/web-0 not evicted after 5m0s")

	_, stderr, code = runWith(t, c.with(deps{}), "status", "--operation", "kubernetes-v1-36-3-nope")
	assert.Equal(t, ExitError, code)
	assert.Contains(t, stderr, "no such operation kubernetes-v1-36-3-nope in namespace ichor-system")
}

func TestWatchJSONLines(t *testing.T) {
	_, raw := goldenPlan(t)
	op := kubeletsStage(operation(api.PhaseRunning))
	op.Status.Phase = api.PhaseSucceeded
	op.Status.FinishedAt = &metav1.Time{Time: now0.Add(5 * time.Minute)}
	c := newJobCluster(stateOf(t, op, raw))

	stdout, stderr, code := runWith(t, c.with(deps{}), "status", "--watch", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)

	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 1, "one document per change: an ended operation is one")

	var doc struct {
		Kind     string            `json:"kind"`
		Progress progress.Progress `json:"progress"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &doc))
	assert.Equal(t, "Operation", doc.Kind)
	assert.Equal(t, int64(290), doc.Progress.ElapsedSeconds)
	assert.Nil(t, doc.Progress.RemainingSeconds)
}

// TestWatchWakesOnTheState: the follower hears the runner's write of the state as
// it lands (a watch), not at its next poll, here an hour away: an operation that
// succeeds is said at once, once its Job's runner pod ended (its runner releases the
// lock and removes its credentials after it wrote Succeeded). The Job controller's
// Complete, which comes up to its batch period later, is not waited for: the Job here
// never gets it.
func TestWatchWakesOnTheState(t *testing.T) {
	_, raw := goldenPlan(t)
	op := kubeletsStage(operation(api.PhaseRunning))
	runner := func(phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "runner-pod", Namespace: job.DefaultNamespace, Labels: map[string]string{"job-name": op.Status.Job}},
			Status: corev1.PodStatus{Phase: phase}}
	}
	handedOver := runner(corev1.PodFailed) // a predecessor that handed over (exit 5)
	handedOver.Name = "runner-pod-before"
	c := newJobCluster(stateOf(t, op, raw), &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: op.Status.Job, Namespace: job.DefaultNamespace}},
		handedOver, runner(corev1.PodRunning))

	d := c.with(deps{})
	d.job.poll = time.Hour

	var ended atomic.Bool

	written := make(chan error, 1)

	go func() {
		time.Sleep(200 * time.Millisecond) // the runner's last node, verified

		done := kubeletsStage(operation(api.PhaseRunning))
		done.Status.Phase = api.PhaseSucceeded
		done.Status.FinishedAt = &metav1.Time{Time: now0.Add(5 * time.Minute)}

		_, err := c.kube.CoreV1().ConfigMaps(job.DefaultNamespace).Update(context.Background(), stateOf(t, done, raw), metav1.UpdateOptions{})
		if err != nil {
			written <- err

			return
		}

		time.Sleep(200 * time.Millisecond) // the runner ends

		ended.Store(true)

		_, err = c.kube.CoreV1().Pods(job.DefaultNamespace).UpdateStatus(context.Background(), runner(corev1.PodSucceeded), metav1.UpdateOptions{})
		written <- err
	}()

	stdout, stderr, code := runWith(t, d, "status", "--watch")
	endedFirst := ended.Load()

	require.NoError(t, <-written)
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Succeeded")
	assert.True(t, endedFirst, "returned once the runner's pod ended")
	assert.NotContains(t, stderr, "warning")
}

func TestOneLineErrors(t *testing.T) {
	corrupt := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: job.StateName, Namespace: job.DefaultNamespace}, BinaryData: map[string][]byte{job.OperationKey: []byte("{")}}
	corruptPlan := stateOf(t, operation(api.PhaseSucceeded), []byte(`{"kind":"Plan"}`))
	corruptPlan.BinaryData[job.PlanKey] = []byte(`{"kind":"Plan"}`)

	tests := []struct {
		name   string
		objs   []runtime.Object
		args   []string
		code   int
		stderr string
	}{
		{name: "corrupted state", objs: []runtime.Object{corrupt}, args: []string{"status"}, code: ExitError, stderr: "state configmap ichor-system/ichor-state is corrupted"},
		{name: "corrupted plan", objs: []runtime.Object{corruptPlan}, args: []string{"status"}, code: ExitError, stderr: "state configmap ichor-system/ichor-state is corrupted (plan.json.gz: gzip: invalid header): stop"},
		{name: "corrupted plan, watched", objs: []runtime.Object{corruptPlan}, args: []string{"status", "--watch"}, code: ExitError, stderr: "then delete the configmap"},
		{name: "corrupted plan, by ID", objs: []runtime.Object{corruptPlan}, args: []string{"status", "--operation", "kubernetes-v1-36-3-abcde"}, code: ExitError, stderr: "(plan.json.gz: gzip: invalid header)"},
		{name: "no operation", args: []string{"status"}, code: ExitError, stderr: "no operation in namespace ichor-system: start one with kubectl ichor upgrade"},
		{name: "no operation to resume", args: []string{"resume", "-n", "upgrades"}, code: ExitError, stderr: "no operation in namespace upgrades"},
		{name: "bad -o", args: []string{"status", "-o", "wide"}, code: ExitError, stderr: `-o "wide": pass -o json or -o yaml`},
		{name: "-o yaml and --watch", args: []string{"status", "-o", "yaml", "--watch"}, code: ExitError, stderr: "-o yaml and --watch do not go together: --watch -o json streams"},
		{
			name: "paused", objs: []runtime.Object{stateOf(t, func() *api.Operation {
				op := operation(api.PhasePaused)
				op.Status.Stage, op.Status.PausedNode, op.Status.Reason, op.Status.Action = "Kubelets", "worker-1", "node NotReady after 20m0s", "look at worker-1's kubelet, then kubectl ichor resume"

				return op
			}(), nil)},
			args: []string{"status", "--watch"}, code: ExitPaused,
			stderr: "error: operation kubernetes-v1-36-3-abcde paused: Kubelets worker-1: node NotReady after 20m0s: look at worker-1's kubelet, then kubectl ichor resume\n",
		},
		{name: "aborted", objs: []runtime.Object{stateOf(t, operation(api.PhaseAborted), nil)}, args: []string{"status", "--watch"}, code: ExitError, stderr: "was aborted"},
		{name: "run without --operation", args: []string{"run"}, code: job.ExitFinal, stderr: "--operation is required"},
		{name: "bad credentials", args: []string{"upgrade", "kubernetes", "--to", "v1.36.3", "--talos-credentials", "mine"}, code: ExitError, stderr: `--talos-credentials "mine": pass serviceaccount or local`},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newJobCluster(tt.objs...)

			_, stderr, code := runWith(t, c.with(fakeDeps(fixture(), nil)), tt.args...)
			assert.Equal(t, tt.code, code, stderr)
			assert.Contains(t, stderr, tt.stderr)
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
		})
	}

	c := newJobCluster(stateOf(t, operation(api.PhaseSucceeded), nil))
	_, stderr, code := runWith(t, c.with(deps{}), "status", "--watch")
	assert.Equal(t, ExitOK, code, stderr)
}

func talosSecret() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: job.TalosAccountName, Namespace: job.DefaultNamespace},
		Data:       map[string][]byte{job.TalosconfigKey: []byte("context: x")},
	}
}

func TestUpgradeConfirms(t *testing.T) {
	c := newJobCluster(talosSecret())

	stdout, stderr, code := runWith(t, c.with(fakeDeps(fixture(), nil)), "upgrade", "kubernetes", "--to", "v1.36.3")
	assert.Equal(t, ExitError, code)
	assert.Equal(t, "error: no terminal to confirm on: pass --yes to upgrade without confirmation\n", stderr)
	assert.Contains(t, stdout, "Stage 4/4 Kubelets", "the plan is shown first")

	_, err := c.kube.CoreV1().ConfigMaps(job.DefaultNamespace).Get(context.Background(), job.StateName, metav1.GetOptions{})
	assert.Error(t, err, "nothing is created")

	// On a terminal, anything but yes changes nothing.
	d := c.with(fakeDeps(fixture(), nil))
	d.job.terminal = func(any) bool { return true }

	var out, errOut bytes.Buffer

	code = run(context.Background(), genericiooptions.IOStreams{In: strings.NewReader("n\n"), Out: &out, ErrOut: &errOut}, []string{"upgrade", "kubernetes", "--to", "v1.36.3"}, d)
	assert.Equal(t, ExitError, code)
	assert.Contains(t, out.String(), `Upgrade Kubernetes of cluster "lab" to v1.36.3, run by a Job in namespace ichor-system? [y/N]: `)
	assert.Equal(t, "error: not confirmed: nothing was changed\n", errOut.String())

	out.Reset()
	errOut.Reset()

	code = run(context.Background(), genericiooptions.IOStreams{In: strings.NewReader("yes\n"), Out: &out, ErrOut: &errOut}, []string{"upgrade", "kubernetes", "--to", "v1.36.3", "--detach"}, d)
	assert.Equal(t, ExitOK, code, errOut.String())
	assert.Contains(t, out.String(), "Launched operation kubernetes-v1-36-3-")
}

func TestUpgradeLaunchesTheJob(t *testing.T) {
	c := newJobCluster(talosSecret())

	stdout, stderr, code := runWith(t, c.with(fakeDeps(fixture(), nil)), "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--detach", "--drain-timeout", "9m")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "Launched operation kubernetes-v1-36-3-")
	assert.Contains(t, stdout, "Follow it with: kubectl ichor status --watch (logs: kubectl ichor logs -f)")

	ctx := context.Background()
	op, err := (&job.Store{Client: c.kube.CoreV1(), Namespace: job.DefaultNamespace}).Plan(ctx)
	require.NoError(t, err)

	var plan api.Plan
	require.NoError(t, json.Unmarshal(op, &plan))
	assert.Len(t, plan.Stages, 4, "the confirmed plan is kept")

	jobs, err := c.kube.BatchV1().Jobs(job.DefaultNamespace).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, jobs.Items, 1)
	assert.Equal(t, version.DefaultImage(), jobs.Items[0].Spec.Template.Spec.Containers[0].Image)

	ctl := &job.Control{Kube: c.kube, Namespace: job.DefaultNamespace}
	state, err := ctl.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, 9*time.Minute, api.Timeout(state.Spec.Timeouts.Drain))
	assert.Equal(t, "kubectl-ichor "+version.Version, state.Spec.CreatedBy)

	// A second upgrade is refused, naming the operation in progress.
	_, stderr, code = runWith(t, c.with(fakeDeps(fixture(), nil)), "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	assert.Equal(t, ExitError, code)
	assert.Contains(t, stderr, "error: operation "+state.Spec.ID+" (Pending, launched ")
	assert.Contains(t, stderr, "is starting in job ichor-system/"+state.Status.Job)
}

func TestUpgradeRefusedNamesTheHolder(t *testing.T) {
	pod0 := "ichor-kubernetes-v1-36-3-abcde-1-x7k2p"
	holder, renewed, duration := job.DefaultNamespace+"/"+pod0, metav1.NewMicroTime(now0.Add(5*time.Minute)), int32(15)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: job.LockName, Namespace: job.LockNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &renewed, LeaseDurationSeconds: &duration},
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod0, Namespace: job.DefaultNamespace}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}

	c := newJobCluster(stateOf(t, kubeletsStage(operation(api.PhaseRunning)), nil), lease, pod)

	stdout, stderr, code := runWith(t, c.with(fakeDeps(fixture(), nil)), "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	assert.Equal(t, ExitError, code)
	assert.Equal(t, "error: operation kubernetes-v1-36-3-abcde (Running, launched 5m0s ago) holds the lock lease kube-system/ichor-lock "+
		"(holder: pod ichor-system/ichor-kubernetes-v1-36-3-abcde-1-x7k2p): one operation per cluster; follow it with kubectl ichor status --watch, or stop it with kubectl ichor abort\n", stderr)
	assert.Empty(t, stdout, "refused before anything is read or shown")
}

func TestDetach(t *testing.T) {
	op := kubeletsStage(operation(api.PhaseRunning))
	c := newJobCluster(stateOf(t, op, nil), &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: op.Status.Job, Namespace: job.DefaultNamespace}})

	ctx, cancel := context.WithCancel(context.Background())

	var out, errOut bytes.Buffer

	go func() {
		time.Sleep(50 * time.Millisecond)
		cancel() // Ctrl-C
	}()

	code := run(ctx, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}, []string{"status", "--watch"}, c.with(deps{}))
	assert.Equal(t, ExitDetached, code)
	assert.Contains(t, out.String(), "Stage 4/4 Kubelets")
	assert.Equal(t, "\nDetached: operation kubernetes-v1-36-3-abcde goes on in the cluster. Follow it again with: kubectl ichor status --watch\n", errOut.String())
}

func TestRunVerb(t *testing.T) {
	tests := []struct {
		name   string
		engine func(ctx context.Context) error
		code   int
		phase  api.Phase
	}{
		{name: "succeeds", engine: func(context.Context) error { return nil }, code: ExitOK, phase: api.PhaseSucceeded},
		{
			name: "pauses", code: ExitPaused, phase: api.PhasePaused,
			engine: func(context.Context) error {
				return &engine.PauseError{Stage: "Kubelets", Node: "worker-1", Reason: "r", Action: "a"}
			},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newJobCluster(stateOf(t, operation(api.PhasePending), nil),
				&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "runner-pod", Namespace: job.DefaultNamespace}})
			c.engine = engineFunc(tt.engine)

			stdout, stderr, code := runWith(t, c.with(deps{}), "run", "--operation", "kubernetes-v1-36-3-abcde", "--namespace", job.DefaultNamespace)
			assert.Equal(t, tt.code, code, stderr)
			assert.Regexp(t, `(?m)^\d\d:\d\d:\d\d took the lock: operation kubernetes-v1-36-3-abcde is Running`, stdout)
			assert.Regexp(t, `(?m)^\d\d:\d\d:\d\d memory: peak resident \d+\.\d MiB \(VmHWM\)$`, stdout, "the runner's own peak, last")

			op, err := (&job.Control{Kube: c.kube, Namespace: job.DefaultNamespace}).Get(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.phase, op.Status.Phase)
			assert.Equal(t, "runner-pod", op.Status.Runner)
		})
	}
}

// TestRunVerbWithoutCredentials: the Job's pod started without its Talos
// credentials (their Secret is optional, and deleted at the operation's end).
// After the end it exits 0, which ends its Job; while the operation runs it stops
// for good (ExitFinal) and says how to write them again.
func TestRunVerbWithoutCredentials(t *testing.T) {
	tests := []struct {
		phase api.Phase
		code  int
		want  string
	}{
		{phase: api.PhaseSucceeded, code: ExitOK, want: "operation kubernetes-v1-36-3-abcde already succeeded"},
		{phase: api.PhaseRunning, code: job.ExitFinal, want: "operation kubernetes-v1-36-3-abcde is Running but the runner's Talos credentials " +
			"(secret ichor-system/ichor-talos) are gone: kubectl ichor resume writes them again"},
	}

	for _, tt := range tests {
		t.Run(string(tt.phase), func(t *testing.T) {
			c := newJobCluster(stateOf(t, operation(tt.phase), nil))
			c.noTalosconfig = true
			c.engine = engineFunc(func(context.Context) error {
				t.Error("no engine may run")

				return nil
			})

			stdout, stderr, code := runWith(t, c.with(deps{}), "run", "--operation", "kubernetes-v1-36-3-abcde", "--namespace", job.DefaultNamespace)
			assert.Equal(t, tt.code, code, stderr)
			assert.Contains(t, stdout+stderr, tt.want)
			assert.NotContains(t, stdout, "took the lock")
		})
	}
}

// The runner's peak memory is its own VmHWM: getrusage's ru_maxrss would count the
// memory of a process that started it with vfork.
func TestVmHWM(t *testing.T) {
	kib, ok := vmHWM([]byte("Name:\tkubectl-ichor\nVmPeak:\t 1391744 kB\nVmSize:\t 1326208 kB\nVmHWM:\t   92768 kB\nVmRSS:\t   86192 kB\n"))
	assert.True(t, ok)
	assert.Equal(t, int64(92768), kib)

	_, ok = vmHWM([]byte("Name:\tkthreadd\n"))
	assert.False(t, ok, "a kernel thread has no memory lines")
}

type engineFunc func(ctx context.Context) error

func (f engineFunc) Run(ctx context.Context) error { return f(ctx) }

func TestAbortAndResumeCommands(t *testing.T) {
	op := kubeletsStage(operation(api.PhaseRunning))
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-2", Annotations: map[string]string{"ichor.dev/cordoned": "2026-11-29T12:04:00Z"}},
		Spec:       corev1.NodeSpec{Unschedulable: true},
	}
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: op.Status.Job, Namespace: job.DefaultNamespace, Labels: map[string]string{
		job.LabelOperation: op.Spec.ID, job.LabelManagedBy: job.AppName,
	}}}
	c := newJobCluster(stateOf(t, op, nil), node, j, talosSecret())

	stdout, stderr, code := runWith(t, c.with(deps{}), "abort")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, `Aborted operation kubernetes-v1-36-3-abcde (it was Running)
  stopped job ichor-system/ichor-kubernetes-v1-36-3-abcde-1
  uncordoned worker-2
  removed the Job's credentials: secret ichor-system/ichor-talos
  the state stays in configmap ichor-system/ichor-state for the record
`, stdout)

	_, stderr, code = runWith(t, c.with(deps{}), "resume")
	assert.Equal(t, ExitError, code)
	assert.Equal(t, "error: operation kubernetes-v1-36-3-abcde was aborted: start a new one with kubectl ichor upgrade\n", stderr)

	// A paused operation resumes with a new Job.
	paused := operation(api.PhasePaused)
	c = newJobCluster(stateOf(t, paused, nil), talosSecret())

	stdout, stderr, code = runWith(t, c.with(deps{}), "resume", "--detach")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, "Resumed operation kubernetes-v1-36-3-abcde: job ichor-system/ichor-kubernetes-v1-36-3-abcde-2\nFollow it with: kubectl ichor status --watch\n", stdout)
}

// TestAbortCommandStateMissing: with the state ConfigMap gone, abort cleans up what the
// operation left, found by its labels, and says the state was missing; with nothing
// left, it is an error.
func TestAbortCommandStateMissing(t *testing.T) {
	cordoned := func(name string, held bool) *corev1.Node {
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"ichor.dev/cordoned": "2026-11-29T12:04:00Z"}},
			Spec:       corev1.NodeSpec{Unschedulable: true},
		}
		if held {
			n.Annotations["ichor.dev/hold"] = "disk"
		}

		return n
	}
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "ichor-kubernetes-v1-36-3-abcde-1", Namespace: job.DefaultNamespace, Labels: map[string]string{
			job.LabelOperation: "kubernetes-v1-36-3-abcde", job.LabelManagedBy: job.AppName,
		}},
		Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue}}},
	}
	c := newJobCluster(cordoned("worker-2", false), cordoned("worker-3", true), j, talosSecret())

	stdout, stderr, code := runWith(t, c.with(deps{}), "abort")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, `The state of namespace ichor-system was missing (configmap ichor-system/ichor-state deleted, or pruned by a GitOps tool): `+
		`cleaned up what operation kubernetes-v1-36-3-abcde left, found by its labels
  stopped job ichor-system/ichor-kubernetes-v1-36-3-abcde-1
  uncordoned worker-2
  left cordoned worker-3: held (ichor.dev/hold) and cordoned by ichor; without the state ichor cannot tell whether an upgrade left it `+
		`cordoned on purpose: kubectl uncordon worker-3 once fit, or remove the hold (kubectl annotate node worker-3 ichor.dev/hold-) and upgrade again
  removed the Job's credentials: secret ichor-system/ichor-talos
`, stdout)

	require.NoError(t, c.kube.CoreV1().Nodes().Delete(context.Background(), "worker-3", metav1.DeleteOptions{}))

	stdout, stderr, code = runWith(t, c.with(deps{}), "abort")
	assert.Equal(t, ExitError, code)
	assert.Empty(t, stdout)
	assert.Equal(t, "error: no operation in namespace ichor-system (no configmap ichor-state) and nothing of one is left: nothing to abort; "+
		"pass -n with the namespace it runs in\n", stderr)
}

// TestAbortCommandAfterSuccessKeepsHeld: abort after a success leaves a held node that
// ichor left cordoned on purpose as it is, and says how to release it.
func TestAbortCommandAfterSuccessKeepsHeld(t *testing.T) {
	held := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-2", Annotations: map[string]string{"ichor.dev/cordoned": "2026-11-29T12:04:00Z", "ichor.dev/hold": "disk"}},
		Spec:       corev1.NodeSpec{Unschedulable: true},
	}
	c := newJobCluster(stateOf(t, operation(api.PhaseSucceeded), nil), held)

	stdout, stderr, code := runWith(t, c.with(deps{}), "abort")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, `Operation kubernetes-v1-36-3-abcde succeeded: it stays Succeeded; cleaned up what its end left
  left cordoned worker-2: held (ichor.dev/hold) and cordoned by ichor; the upgrade succeeded without it and left it cordoned on purpose: `+
		`kubectl uncordon worker-2 once fit, or remove the hold (kubectl annotate node worker-2 ichor.dev/hold-) and upgrade again
  no credential of the Job was left
  the state stays in configmap ichor-system/ichor-state for the record
`, stdout)

	n, err := c.kube.CoreV1().Nodes().Get(context.Background(), "worker-2", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, n.Spec.Unschedulable, "the held node stays cordoned")
}

func TestLogs(t *testing.T) {
	op := operation(api.PhaseRunning)
	pod := func(name string, created time.Time) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: job.DefaultNamespace, CreationTimestamp: metav1.NewTime(created), Labels: map[string]string{job.LabelOperation: op.Spec.ID}},
			Spec:       corev1.PodSpec{NodeName: "cp-1"},
			Status:     corev1.PodStatus{Phase: corev1.PodFailed},
		}
	}

	c := newJobCluster(stateOf(t, op, nil), pod("second", now0.Add(time.Minute)), pod("first", now0))

	stdout, stderr, code := runWith(t, c.with(deps{}), "logs")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, "==> pod first (node cp-1, Failed) <==\nfake logs==> pod second (node cp-1, Failed) <==\nfake logs", stdout)
}

// TestUpgradeTalosAllowEtcdOutage: --allow-etcd-outage goes into the
// operation's spec, which the runner gives the engine.
func TestUpgradeTalosAllowEtcdOutage(t *testing.T) {
	for _, allow := range []bool{false, true} {
		c := newJobCluster(talosSecret())
		f := fixture()

		for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
			f.Node(n).Talos = "v1.12.4"
		}

		args := []string{"upgrade", "talos", "--to", "v1.13.9", "--yes", "--detach"}
		if allow {
			args = append(args, "--allow-etcd-outage")
		}

		_, stderr, code := runWith(t, c.with(fakeDeps(f, nil)), args...)
		require.Equal(t, ExitOK, code, stderr)

		state, err := (&job.Control{Kube: c.kube, Namespace: job.DefaultNamespace}).Get(context.Background())
		require.NoError(t, err)
		assert.Equal(t, allow, state.Spec.AllowEtcdOutage)
	}
}

// TestUpgradeTalosHandsThePlansEtcdPasses: the plan's two passes over etcd go into
// the state's Memo, for the runner's first read of etcd to take up (engine.EtcdPassMemo).
func TestUpgradeTalosHandsThePlansEtcdPasses(t *testing.T) {
	c := newJobCluster(talosSecret())
	f := fixture()

	for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
		f.Node(n).Talos = "v1.12.4"
	}

	d := fakeDeps(f, nil)
	d.talos = func(context.Context, TalosFlags) (discovery.TalosReader, error) {
		ids := map[string]uint64{}
		for i, n := range []string{"cp-1", "cp-2", "cp-3"} {
			ids[f.Node(n).IP] = uint64(i + 1)
		}

		return &etcdTalos{FakeTalos: f.Talos(), ids: ids}, nil
	}

	stdout, stderr, code := runWith(t, c.with(d), "upgrade", "talos", "--to", "v1.13.9", "--yes", "--detach")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stdout, "3 voter(s) healthy", "the plan read etcd")

	state, err := (&job.Control{Kube: c.kube, Namespace: job.DefaultNamespace}).Get(context.Background())
	require.NoError(t, err)

	var passes []stages.EtcdPass
	require.NoError(t, json.Unmarshal([]byte(state.Status.Memo["talos/etcd-passes"]), &passes), "memo: %v", state.Status.Memo)
	require.Len(t, passes, 2)

	for _, p := range passes {
		assert.Len(t, p.Status, 3)
		assert.False(t, p.Ended.Before(p.Begun))
	}

	assert.False(t, passes[1].Begun.Before(passes[0].Ended), "in order")
}

// etcdTalos is a Talos client that reads a healthy etcd of three members, by IP.
type etcdTalos struct {
	*discoverytest.FakeTalos
	ids map[string]uint64
}

func (e *etcdTalos) EtcdStatus(_ context.Context, ip string) (talos.EtcdStatus, error) {
	return talos.EtcdStatus{MemberID: e.ids[ip], Leader: 1, RaftIndex: 100, RaftAppliedIndex: 100, RaftTerm: 2}, nil
}

func (e *etcdTalos) EtcdMembers(context.Context, string) ([]talos.EtcdMember, error) {
	return []talos.EtcdMember{{ID: 1, Hostname: "cp-1"}, {ID: 2, Hostname: "cp-2"}, {ID: 3, Hostname: "cp-3"}}, nil
}

func (e *etcdTalos) EtcdAlarms(context.Context, string) ([]talos.EtcdAlarm, error) { return nil, nil }

// TestUpgradePullFlags: --pull-timeout and --pull-concurrency of both upgrade commands
// reach the Job's spec (their defaults too); a bad value is refused in one line that
// says what to pass, before anything is launched.
func TestUpgradePullFlags(t *testing.T) {
	talos113 := func() *discoverytest.Cluster {
		f := fixture()
		for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
			f.Node(n).Talos = "v1.12.4"
		}

		return f
	}

	for _, tc := range []struct {
		name        string
		snap        func() *discoverytest.Cluster
		args        []string
		timeout     time.Duration
		concurrency int
	}{
		{"kubernetes, set", fixture, []string{"upgrade", "kubernetes", "--to", "v1.36.3", "--pull-timeout", "90s", "--pull-concurrency", "4"}, 90 * time.Second, 4},
		{"kubernetes, defaults", fixture, []string{"upgrade", "kubernetes", "--to", "v1.36.3"}, engine.DefaultPullTimeout, engine.DefaultPullConcurrency},
		{"talos, set", talos113, []string{"upgrade", "talos", "--to", "v1.13.9", "--pull-timeout", "15m", "--pull-concurrency", "100"}, 15 * time.Minute, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newJobCluster(talosSecret())

			_, stderr, code := runWith(t, c.with(fakeDeps(tc.snap(), nil)), append(tc.args, "--yes", "--detach")...)
			require.Equal(t, ExitOK, code, stderr)

			state, err := (&job.Control{Kube: c.kube, Namespace: job.DefaultNamespace}).Get(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tc.timeout, api.Timeout(state.Spec.Timeouts.Pull))
			assert.Equal(t, tc.concurrency, state.Spec.PullConcurrency)
		})
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pull-timeout", "0s"}, "error: --pull-timeout 0s: pass a positive duration, e.g. 5m0s\n"},
		{[]string{"--pull-timeout", "-1m"}, "error: --pull-timeout -1m0s: pass a positive duration, e.g. 5m0s\n"},
		{[]string{"--pull-concurrency", "0"}, "error: --pull-concurrency 0: pass how many nodes may pull at once, 1 or more (default 32)\n"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			for _, kind := range []string{"kubernetes", "talos"} {
				c := newJobCluster(talosSecret())

				stdout, stderr, code := runWith(t, c.with(fakeDeps(talos113(), nil)), append([]string{"upgrade", kind, "--to", "v1.36.3", "--yes"}, tc.args...)...)
				assert.Equal(t, ExitError, code)
				assert.Equal(t, tc.want, stderr)
				assert.Empty(t, stdout, "refused before planning")

				jobs, err := c.kube.BatchV1().Jobs(job.DefaultNamespace).List(context.Background(), metav1.ListOptions{})
				require.NoError(t, err)
				assert.Empty(t, jobs.Items)
			}
		})
	}
}

// TestUpgradeTalosInstallers: --installer-image (for every node and per
// node) and --drop-extensions go into the operation's spec, which the
// runner gives the engine; --image there is the Job's image.
func TestUpgradeTalosInstallers(t *testing.T) {
	c := newJobCluster(talosSecret())
	f := fixture()

	for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
		f.Node(n).Talos = "v1.12.4"
	}

	_, stderr, code := runWith(t, c.with(fakeDeps(f, nil)), "upgrade", "talos", "--to", "v1.13.9", "--yes", "--detach",
		"--installer-image", "registry.local/talos/installer:v1.13.9", "--installer-image", "worker-1=registry.local/talos/gpu-installer:v1.13.9",
		"--drop-extensions", "worker-1", "--image", "registry.local/kubectl-ichor:v9")
	require.Equal(t, ExitOK, code, stderr)

	state, err := (&job.Control{Kube: c.kube, Namespace: job.DefaultNamespace}).Get(context.Background())
	require.NoError(t, err)
	assert.Equal(t, api.Installers{
		Image: "registry.local/talos/installer:v1.13.9", Nodes: map[string]string{"worker-1": "registry.local/talos/gpu-installer:v1.13.9"},
		DropExtensions: []string{"worker-1"},
	}, state.Spec.Installers)
	assert.Equal(t, "registry.local/kubectl-ichor:v9", state.Spec.Image)
}

// TestPausedOutcomeSaysResumeOnce: a pause's action that already ends in "then resume"
// names the command once, in the operation's namespace; any other action is followed by it.
func TestPausedOutcomeSaysResumeOnce(t *testing.T) {
	for _, tc := range []struct {
		name, action, namespace, want string
	}{
		{
			name: "action ends in resume", action: "fix the tag, then resume", namespace: "upgrades",
			want: "operation op-1 paused: APIServers cp-2: version unreadable: fix the tag, then kubectl ichor resume -n upgrades",
		},
		{
			name: "action without resume", action: "remove the hold", namespace: job.DefaultNamespace,
			want: "operation op-1 paused: APIServers cp-2: version unreadable: remove the hold; then continue with kubectl ichor resume",
		},
		{
			name: "action names the command", action: "run kubectl ichor resume after the fix", namespace: job.DefaultNamespace,
			want: "operation op-1 paused: APIServers cp-2: version unreadable: run kubectl ichor resume after the fix",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op := &api.Operation{}
			op.Spec.ID = "op-1"
			op.Status.Phase = api.PhasePaused
			op.Status.Stage = "APIServers"
			op.Status.PausedNode = "cp-2"
			op.Status.Reason = "version unreadable"
			op.Status.Action = tc.action

			ended, err := outcome(op, tc.namespace)
			require.True(t, ended)
			require.EqualError(t, err, tc.want)
			assert.Equal(t, 1, strings.Count(err.Error(), "resume"))
		})
	}
}

// TestFollowRemovesTheCopiedTalosconfig: once an operation launched with
// --talos-credentials=local succeeded, the follower deletes the copy of the talosconfig
// (the runner does too, but after the state says Succeeded); a paused one keeps it.
func TestFollowRemovesTheCopiedTalosconfig(t *testing.T) {
	secret := func() *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: job.LocalTalosconfigName, Namespace: job.DefaultNamespace}}
	}

	for _, tc := range []struct {
		phase api.Phase
		code  int
		kept  bool
	}{
		{api.PhaseSucceeded, ExitOK, false},
		{api.PhasePaused, ExitPaused, true},
	} {
		t.Run(string(tc.phase), func(t *testing.T) {
			op := operation(tc.phase)
			op.Spec.Credentials = api.CredentialsLocal
			op.Status.Reason = "drain: pod default/web-0 not evicted after 5m0s"

			c := newJobCluster(stateOf(t, op, nil), secret())

			_, stderr, code := runWith(t, c.with(deps{}), "status", "--watch")
			require.Equal(t, tc.code, code, stderr)
			assert.NotContains(t, stderr, "warning")

			_, err := c.kube.CoreV1().Secrets(job.DefaultNamespace).Get(context.Background(), job.LocalTalosconfigName, metav1.GetOptions{})
			assert.Equal(t, tc.kept, err == nil, "secret kept: %v", err)
		})
	}
}
