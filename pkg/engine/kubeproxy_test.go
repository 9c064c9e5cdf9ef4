package engine

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// TestPlanAndRunAgreeOnTheManifests: plan dry-runs the manifests as the run will apply
// them. Its prediction (ManifestsAtTarget of the control plane's manifests and config,
// read before the run) is what the run applies once Talos re-rendered them, and the same
// ManifestApplier.Check finds the same conflicts: the kube-proxy DaemonSet, whose image
// Talos' own Create holds (talos, operation Update), taken over; the ServiceAccount Helm
// changed, skipped. The current manifests, dry-run as they are, show no conflict on the
// DaemonSet at all: its image does not change there.
func TestPlanAndRunAgreeOnTheManifests(t *testing.T) {
	ctx := context.Background()
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
	f.manifestOwners = map[string]string{
		"DaemonSet kube-system/kube-proxy":      "talos/Update",
		"ServiceAccount kube-system/kube-proxy": "helm",
	}

	cp := f.machines[0]
	current, err := (*fakeTalos)(f).Manifests(ctx, cp.ip)
	require.NoError(t, err)

	node := discovery.Node{Name: cp.name, ControlPlane: true, InternalIP: cp.ip, KubeletVersion: "v1.35.4"}
	predicted, err := stages.ManifestsAtTarget(current, node, cp.active, stages.MustParseVersion("v1.36.3"))
	require.NoError(t, err)
	assert.Equal(t, "registry.k8s.io/kube-proxy:v1.36.3", kubeProxyImage(predicted))
	assert.Equal(t, "registry.k8s.io/kube-proxy:v1.35.4", kubeProxyImage(current), "not changed")

	applier := kube.NewManifestApplier(f.dyn, f.cs.Discovery())

	planned, err := applier.Check(ctx, predicted, kube.SyncOptions{})
	require.NoError(t, err)
	require.Len(t, planned.TakenOver, 1)
	assert.Equal(t, stages.KubeProxyObject, planned.TakenOver[0].Object)
	assert.Equal(t, []kube.Holder{{Manager: "talos", Operation: metav1.ManagedFieldsOperationUpdate}}, planned.TakenOver[0].From)
	require.Len(t, planned.Skipped, 1)
	assert.Equal(t, "ServiceAccount kube-system/kube-proxy", planned.Skipped[0].Object)

	asIs, err := applier.Check(ctx, current, kube.SyncOptions{})
	require.NoError(t, err)
	assert.Empty(t, asIs.TakenOver, "the current render changes no image: it meets no conflict on the DaemonSet")

	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec
	require.NoError(t, e.Run(ctx))

	// The run applied the prediction, less what it skipped, and took the DaemonSet over.
	var want []string

	for _, obj := range predicted {
		if kube.ObjectName(obj) != planned.Skipped[0].Object {
			b, err := json.Marshal(obj.Object)
			require.NoError(t, err)
			want = append(want, string(b))
		}
	}

	var got []string

	for _, obj := range f.appliedObjects {
		b, err := json.Marshal(obj.Object)
		require.NoError(t, err)
		got = append(got, string(b))
	}

	assert.ElementsMatch(t, want, got, "the run applies what plan predicted")
	assert.Contains(t, f.applied, "talos true DaemonSet kube-system/kube-proxy", "taken over")
	assert.NotEmpty(t, rec.with("KubeProxy", `took over 1 from Talos' own earlier writes: DaemonSet kube-system/kube-proxy (from "talos" (Update))`,
		"skipped 1 changed by another field manager: ServiceAccount kube-system/kube-proxy"))
	requireFinished(t, f, "v1.36.3")
}

// TestEngineKubeProxySkippedPausesAtOnce: a kube-proxy DaemonSet another field manager
// holds is skipped by the sync, so its rollout cannot come: the stage pauses at once,
// naming the manager and the flag, instead of waiting out the rollout bound.
func TestEngineKubeProxySkippedPausesAtOnce(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
	f.manifestOwners = map[string]string{"DaemonSet kube-system/kube-proxy": "helm/Update"}

	start := time.Now()
	err := f.engine("v1.36.3", func(o *Options) { o.VerifyTimeout = 30 * time.Second }).Run(context.Background())

	pause := pauseOf(t, err, "KubeProxy", "cp-1", `DaemonSet kube-system/kube-proxy skipped: field manager "helm" (Update) holds fields the sync would change`,
		"kube-proxy cannot reach v1.36.3")
	assert.Contains(t, pause.Action, `--manifests-force "DaemonSet kube-system/kube-proxy"`)
	assert.Less(t, time.Since(start), 20*time.Second, "no wait for a rollout that cannot come")
	assert.NotContains(t, strings.Join(f.applied, "\n"), "DaemonSet")
}

// TestEngineRolloutBlockedByHeldNotReadyNode: a held NotReady node's kube-proxy pod takes
// the DaemonSet's only unavailable slot, and the rollout never moves: the stage pauses
// with that cause once it has lasted RolloutStuckAfter, not at the verify bound.
func TestEngineRolloutBlockedByHeldNotReadyNode(t *testing.T) {
	ctx := context.Background()
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})
	f.rolloutStuck = true

	n, err := f.cs.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
	require.NoError(t, err)

	n.Annotations[discovery.HoldAnnotation] = "dead"
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status."}}
	_, err = f.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	require.NoError(t, err)

	pod, err := f.cs.CoreV1().Pods("kube-system").Get(ctx, "kube-proxy-worker-2", metav1.GetOptions{})
	require.NoError(t, err)

	pod.Status.Conditions = readyStatus(false).Conditions
	_, err = f.cs.CoreV1().Pods("kube-system").Update(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)

	start := time.Now()
	err = f.engine("v1.36.3", func(o *Options) {
		o.VerifyTimeout, o.RolloutStuckAfter = 40*time.Second, 100*time.Millisecond
	}).Run(ctx)

	pause := pauseOf(t, err, "KubeProxy", "", "kube-proxy rollout cannot progress",
		"worker-2 is NotReady (NodeStatusUnknown: Kubelet stopped posting node status.) and its pod kube-proxy-worker-2 is not Ready",
		"1 of the DaemonSet's 1 unavailable slot(s)")
	assert.Contains(t, pause.Action, "kubectl delete node worker-2")
	assert.Less(t, time.Since(start), 30*time.Second, "paused on the cause, not at the verify bound")
}

// The bootstrap manifests never overwrite what another field manager changed: such an
// object is skipped and said, unless forced by name; an object the runner may not write
// pauses before anything is applied, naming it.
func TestEngineManifestSync(t *testing.T) {
	t.Run("an object changed by another manager is skipped", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.manifestOwners = map[string]string{"ServiceAccount kube-system/kube-proxy": "helm"}

		rec := &recorder{}
		e := f.engine("v1.36.3")
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		assert.NotContains(t, strings.Join(f.applied, "\n"), "ServiceAccount")
		assert.Contains(t, f.applied, "talos false DaemonSet kube-system/kube-proxy")
		assert.NotEmpty(t, rec.with("KubeProxy cp-1", "skipped ServiceAccount kube-system/kube-proxy", `conflict with "helm"`,
			`--manifests-force "ServiceAccount kube-system/kube-proxy"`))
		assert.NotEmpty(t, rec.with("KubeProxy", "skipped 1 changed by another field manager: ServiceAccount kube-system/kube-proxy"))
	})

	t.Run("forced by name, it is taken over", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.manifestOwners = map[string]string{"ServiceAccount kube-system/kube-proxy": "helm"}

		require.NoError(t, f.engine("v1.36.3", func(o *Options) {
			o.ManifestsForce = []string{"ServiceAccount kube-system/kube-proxy"}
		}).Run(context.Background()))
		assert.Contains(t, f.applied, "talos true ServiceAccount kube-system/kube-proxy")
		assert.Contains(t, f.applied, "talos false DaemonSet kube-system/kube-proxy")
	})

	t.Run("an object the runner may not write pauses before anything is applied", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.manifestForbidden = map[string]bool{"ClusterRoleBinding /kube-proxy": true}

		err := f.engine("v1.36.3").Run(context.Background())
		requirePause(t, err, "KubeProxy", "cp-1", "sync bootstrap manifests (0 of 3 applied, nothing after)",
			"dry-run apply ClusterRoleBinding kube-proxy", "forbidden")
		assert.Empty(t, f.applied, "the dry run found it before anything was applied")
	})
}

// Talos re-renders the bootstrap manifests asynchronously after an apply: the sync waits
// until they carry kube-proxy at the target, and pauses when they never do.
func TestEngineManifestsWaitForTheRerender(t *testing.T) {
	t.Run("late", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.staleManifests, f.staleImage = 2, "registry.k8s.io/kube-proxy:v1.35.4"

		require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
		assert.Contains(t, f.applied, "talos false DaemonSet kube-system/kube-proxy")

		ds, err := f.cs.AppsV1().DaemonSets("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "registry.k8s.io/kube-proxy:v1.36.3", ds.Spec.Template.Spec.Containers[0].Image, "never synced the old render")
	})

	t.Run("never", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.staleManifests, f.staleImage = -1, "registry.k8s.io/kube-proxy:v1.35.4"

		err := f.engine("v1.36.3", func(o *Options) { o.RenderTimeout = 1500 * time.Millisecond }).Run(context.Background())
		requirePause(t, err, "KubeProxy", "cp-1", "Talos has not re-rendered the bootstrap manifests for v1.36.3 after 1.5s (kube-proxy image registry.k8s.io/kube-proxy:v1.35.4)")
		assert.Empty(t, f.applied, "the old render is not applied")
	})
}

func TestEngineKubeProxyDisabled(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 2, workers: 1, kubernetes: "v1.35.4", proxyDisabled: true})

	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	assert.NotEmpty(t, rec.with("KubeProxy [skipped] kube-proxy is disabled"))
	assert.Empty(t, f.applied, "no bootstrap manifests synced")
	assert.Equal(t, fullOrder([]string{"cp-1", "cp-2"}, []string{"worker-1"})[:4], appliedSteps(t, f, "v1.35.4", "v1.36.3")[:4])
	assert.Len(t, f.realApplies(), 2+2+2+1)
	requireFinished(t, f, "v1.36.3")
}
