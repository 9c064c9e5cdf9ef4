package checks_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// preview plans a Kubernetes upgrade of c to v1.36.3, previews its drains
// and runs the drains check.
func preview(t *testing.T, c *discoverytest.Cluster) ([]api.NodeDrain, api.Check) {
	t.Helper()

	snap := c.Snapshot(t)

	plan, err := stages.PlanKubernetes(snap, stages.MustParseVersion("v1.36.3"), stages.Options{MaxUnavailable: 1})
	require.NoError(t, err)

	drains := checks.PreviewDrains(context.Background(), snap, c.Workloads(t), plan)
	check := checks.Drains{}.Run(context.Background(), &checks.Input{Snapshot: snap, Drains: drains})

	return drains, check
}

func drainOf(t *testing.T, drains []api.NodeDrain, node string) api.NodeDrain {
	t.Helper()

	for _, d := range drains {
		if d.Node == node {
			return d
		}
	}

	t.Fatalf("no drain of %s in %+v", node, drains)

	return api.NodeDrain{}
}

func kinds(list []api.DrainFinding) []string {
	var out []string
	for _, f := range list {
		out = append(out, f.Kind+" "+f.Pod)
	}

	return out
}

// twoReplicas adds a two-pod ReplicaSet, one pod on each worker.
func twoReplicas(c *discoverytest.Cluster) {
	c.Pod("worker-1", "default", "web-a", "ReplicaSet/web-1")
	c.Pod("worker-2", "default", "web-b", "ReplicaSet/web-1")
}

func TestDrainPreviewNothingInTheWay(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	twoReplicas(c)
	c.Pod("worker-1", "kube-system", "agent-x", "DaemonSet/agent")

	drains, check := preview(t, c)

	// Every node is drained, in the plan's order: control planes, then workers.
	var order []string
	for _, d := range drains {
		order = append(order, d.Node)
	}

	assert.Equal(t, []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"}, order)

	// Mirror pods and a DaemonSet's pod stay; the ReplicaSet's pod goes.
	assert.Equal(t, 0, drainOf(t, drains, "cp-1").Evict)
	assert.Equal(t, 1, drainOf(t, drains, "worker-1").Evict)
	assert.Empty(t, drainOf(t, drains, "worker-1").Blockers)
	assert.Empty(t, drainOf(t, drains, "worker-1").Risks)

	assert.Equal(t, api.ResultOK, check.Result)
	assert.Equal(t, "5 nodes, 2 pods to evict; nothing blocks them", check.Detail)
}

func TestDrainPreviewBlockers(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	twoReplicas(c)
	c.Pod("worker-2", "default", "debug", "")                           // no controller
	c.Pod("worker-1", "kube-system", "orphan", "DaemonSet/gone")        // its DaemonSet ...
	c.PDBFor("default", "web", 0, 2, map[string]string{"app": "web-a"}) // allows none

	drains, check := preview(t, c)

	assert.Equal(t, []string{"budget default/web-a"}, kinds(drainOf(t, drains, "worker-1").Blockers)[:1])
	assert.Equal(t, []string{"no-controller default/debug"}, kinds(drainOf(t, drains, "worker-2").Blockers))

	assert.Equal(t, api.ResultRefused, check.Result)
	assert.Contains(t, check.Detail, "worker-2: default/debug (no-controller)")
	assert.Contains(t, check.Detail, "worker-1: default/web-a (budget)")
	assert.Contains(t, check.Action, "run the pods with no controller under one")
	assert.Contains(t, check.Action, "relax the budgets")
	assert.Contains(t, check.Action, "kubectl annotate node worker-1 ichor.dev/hold=<reason>")
}

func TestDrainPreviewMissingDaemonSetIsRefused(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	p := c.Pod("worker-1", "kube-system", "orphan", "")
	p.OwnerReferences = append(p.OwnerReferences, ownerRef("DaemonSet", "gone"))

	drains, check := preview(t, c)

	blockers := drainOf(t, drains, "worker-1").Blockers
	require.Len(t, blockers, 1)
	assert.Equal(t, api.DrainRefused, blockers[0].Kind)
	assert.Contains(t, blockers[0].Detail, "kube-system/orphan")
	assert.Equal(t, api.ResultRefused, check.Result)
}

func TestDrainPreviewBudgetOnAHeldNodeBlocksNothing(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Node("worker-2").Hold = discoverytest.Ptr("maintenance")
	c.Pod("worker-2", "default", "db-0", "StatefulSet/db")
	c.PDBFor("default", "db", 0, 1, map[string]string{"app": "db-0"})

	drains, check := preview(t, c)

	for _, d := range drains {
		assert.NotEqual(t, "worker-2", d.Node, "a held node is not drained")
	}

	assert.NotEqual(t, api.ResultRefused, check.Result)
}

func TestDrainPreviewRisks(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	twoReplicas(c)

	cache := c.Pod("worker-1", "default", "cache-0", "ReplicaSet/cache-1")
	cache.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}

	c.Node("worker-2").Labels = map[string]string{"gpu": "true"}
	gpu := c.Pod("worker-2", "default", "train", "ReplicaSet/train-1")
	gpu.Spec.NodeSelector = map[string]string{"gpu": "true"}

	drains, check := preview(t, c)

	assert.ElementsMatch(t, []string{"local-data default/cache-0", "single-replica default/cache-0"},
		kinds(drainOf(t, drains, "worker-1").Risks))
	assert.ElementsMatch(t, []string{"single-replica default/train", "nowhere-to-go default/train"},
		kinds(drainOf(t, drains, "worker-2").Risks))

	assert.Equal(t, api.ResultWarn, check.Result)
	assert.Contains(t, check.Detail, "would hurt: ")
}

func TestDrainPreviewTaintsAndTolerations(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	taint := corev1.Taint{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}

	// Every other node is tainted or cordoned: only a pod that tolerates the
	// taint has somewhere to go.
	for _, n := range []string{"cp-1", "cp-2", "cp-3"} {
		c.Node(n).Taints = []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}
	}

	c.Node("worker-2").Taints = []corev1.Taint{taint}

	c.Pod("worker-1", "default", "plain-a", "ReplicaSet/plain-1")
	c.Pod("worker-1", "default", "plain-b", "ReplicaSet/plain-1")
	tolerant := c.Pod("worker-1", "default", "db-a", "ReplicaSet/db-1")
	tolerant.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "db", Effect: corev1.TaintEffectNoSchedule}}
	c.Pod("worker-2", "default", "db-b", "ReplicaSet/db-1")

	drains, _ := preview(t, c)

	assert.ElementsMatch(t, []string{"nowhere-to-go default/plain-a", "nowhere-to-go default/plain-b"},
		kinds(drainOf(t, drains, "worker-1").Risks))
}

func TestDrainPreviewTalosUpgrade(t *testing.T) {
	c := discoverytest.ThreePlusTwo()
	c.Pod("cp-2", "default", "debug", "")

	snap := c.Snapshot(t)

	plan, err := stages.PlanTalos(snap, stages.MustParseVersion("v1.14.1"), stages.InstallerFlags{}, stages.Options{MaxUnavailable: 1})
	require.NoError(t, err)

	drains := checks.PreviewDrains(context.Background(), snap, c.Workloads(t), plan)

	assert.Len(t, drains, 5, "a Talos upgrade drains every node")
	assert.Equal(t, []string{"no-controller default/debug"}, kinds(drainOf(t, drains, "cp-2").Blockers))
}

func ownerRef(kind, name string) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "apps/v1", Kind: kind, Name: name, UID: types.UID(kind + "/" + name), Controller: discoverytest.Ptr(true)}
}
