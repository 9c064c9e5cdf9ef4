package job

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
)

func ended(id string) Record {
	op := testOperation(id, api.PhaseSucceeded)
	op.Status.FinishedAt = ptrTime(t0.Add(time.Hour))

	return Record{Operation: op, Plan: json.RawMessage(`{"kind":"Plan"}`)}
}

func TestHistoryKeepsTheLastFew(t *testing.T) {
	ctx := context.Background()
	store := &Store{Client: fake.NewClientset().CoreV1(), Namespace: "ichor-system"}

	for i := 1; i <= HistoryKeep+2; i++ {
		require.NoError(t, store.Archive(ctx, ended(fmt.Sprintf("op-%d", i))))
	}

	history, err := store.History(ctx)
	require.NoError(t, err)

	var ids []string
	for _, rec := range history {
		ids = append(ids, rec.Operation.Spec.ID)
	}

	assert.Equal(t, []string{"op-7", "op-6", "op-5", "op-4", "op-3"}, ids, "newest first, the oldest dropped")

	cm, err := store.Client.ConfigMaps("ichor-system").Get(ctx, HistoryName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Len(t, cm.BinaryData, HistoryKeep)
}

func TestFindTheCurrentOrAnEndedOperation(t *testing.T) {
	ctx := context.Background()
	store := &Store{Client: fake.NewClientset(stateObject(t, testOperation("op-2", api.PhaseRunning))).CoreV1(), Namespace: "ichor-system"}
	require.NoError(t, store.Archive(ctx, ended("op-1")))

	rec, err := store.Find(ctx, "op-2")
	require.NoError(t, err)
	assert.Equal(t, api.PhaseRunning, rec.Operation.Status.Phase)
	assert.JSONEq(t, `{"kind":"Plan"}`, string(rec.Plan))

	rec, err = store.Find(ctx, "op-1")
	require.NoError(t, err)
	assert.Equal(t, api.PhaseSucceeded, rec.Operation.Status.Phase)

	_, err = store.Find(ctx, "op-0")
	require.ErrorIs(t, err, ErrNotInHistory)
	assert.EqualError(t, err, "no such operation op-0 in namespace ichor-system: it knows [op-2 op-1] (the last 5 ended are kept)")
}

func TestReplacingAnEndedOperationArchivesIt(t *testing.T) {
	ctx := context.Background()
	old := testOperation("op-1", api.PhaseSucceeded)
	old.Status.AddPause("Kubelets", "worker-1", "drain: budget default/web", t0)

	store := &Store{Client: fake.NewClientset(stateObject(t, old)).CoreV1(), Namespace: "ichor-system"}
	require.NoError(t, store.Create(ctx, testOperation("op-2", api.PhasePending), nil, func(*api.Operation) error { return nil }))

	rec, err := store.Find(ctx, "op-1")
	require.NoError(t, err)
	require.Len(t, rec.Operation.Status.Pauses, 1)
	assert.Equal(t, "worker-1", rec.Operation.Status.Pauses[0].Node)
	assert.JSONEq(t, `{"kind":"Plan"}`, string(rec.Plan))
}

// bigRecord is an ended Kubernetes upgrade of nodes nodes, as the plan
// makes it: three control planes in the first three stages, every node in
// the Kubelets stage (drained), each with its timeline, and the plan it ran.
func bigRecord(t testing.TB, id string, nodes int) Record {
	t.Helper()

	op := testOperation(id, api.PhaseSucceeded)
	plan := api.Plan{APIVersion: api.APIVersion, Kind: api.KindPlan, Upgrade: api.UpgradeKubernetes, Target: "v1.36.3"}
	names := []string{"APIServers", "ControlPlaneComponents", "KubeProxy", "Kubelets"}

	for _, stage := range names {
		st := api.Stage{Name: stage, Description: "a stage"}

		visited := nodes
		if stage != "Kubelets" {
			visited = 3
		}

		for i := range visited {
			name := fmt.Sprintf("worker-%04d", i)
			at := t0.Add(time.Duration(i) * 7 * time.Second)
			SetNode(&op.Status, stage, name, engine.PhaseApplying, "applying", at)
			SetNode(&op.Status, stage, name, engine.PhaseDone, "drained 12 pod(s), node Ready, kubelet v1.36.3, uncordoned", at.Add(31*time.Second))
			st.Nodes = append(st.Nodes, api.NodeStep{Node: name, Role: api.RoleWorker, Batch: i + 1, ConfigLayout: api.LayoutV1Alpha1, Changes: []api.Change{{
				Component: "kubelet", From: "ghcr.io/siderolabs/kubelet:v1.35.4", To: "ghcr.io/siderolabs/kubelet:v1.36.3", Path: "machine.kubelet.image",
			}}})

			if stage == "Kubelets" {
				plan.Drains = append(plan.Drains, api.NodeDrain{Node: name, Evict: 12})
			}
		}

		plan.Stages = append(plan.Stages, st)
	}

	for i := range api.MaxPauses {
		op.Status.AddPause("Kubelets", fmt.Sprintf("worker-%04d", i), "drain: pod default/web-0 not evicted after 5m0s (PodDisruptionBudget default/web)", t0)
	}

	raw, err := json.Marshal(plan)
	require.NoError(t, err)

	return Record{Operation: op, Plan: raw}
}

// TestHistoryAtAThousandNodes: five records of 1000-node upgrades fit under
// the budget, so the ConfigMap's 1 MiB is never reached; the sizes are logged.
func TestHistoryAtAThousandNodes(t *testing.T) {
	ctx := context.Background()
	store := &Store{Client: fake.NewClientset().CoreV1(), Namespace: "ichor-system"}

	for i := range HistoryKeep + 1 {
		rec := bigRecord(t, fmt.Sprintf("op-%d", i), 1000)
		require.NoError(t, store.Archive(ctx, rec))
	}

	cm, err := store.Client.ConfigMaps("ichor-system").Get(ctx, HistoryName, metav1.GetOptions{})
	require.NoError(t, err)

	total := 0
	for _, b := range cm.BinaryData {
		total += len(b)
	}

	t.Logf("1000 nodes: a record is %d KiB compressed; the history holds %d records in %d KiB",
		total/len(cm.BinaryData)>>10, len(cm.BinaryData), total>>10)

	assert.LessOrEqual(t, total, HistoryBudget)
	assert.Less(t, total, 1<<20)
	assert.Len(t, cm.BinaryData, HistoryKeep, "five 1000-node records fit")
}

// configMapSize is what the apiserver holds against a ConfigMap's 1 MiB: the
// sum of its data and binaryData values.
func configMapSize(cm *corev1.ConfigMap) int {
	n := 0
	for _, v := range cm.Data {
		n += len(v)
	}

	for _, v := range cm.BinaryData {
		n += len(v)
	}

	return n
}

// TestStateAtFiveThousandNodes: the state ConfigMap of a 5000-node upgrade,
// every node's timeline filled, fits in a ConfigMap's 1 MiB. The sizes at
// 1000 and 5000 nodes are logged, with the node count 1 MiB would hold.
func TestStateAtFiveThousandNodes(t *testing.T) {
	var perNode float64

	for _, nodes := range []int{1000, 5000} {
		big := bigRecord(t, "x", nodes)
		state, err := EncodeState("ichor-system", big.Operation, big.Plan)
		require.NoError(t, err)

		op, err := json.Marshal(big.Operation)
		require.NoError(t, err)

		size := configMapSize(state)
		perNode = float64(size) / float64(nodes)
		t.Logf("%d nodes: the state ConfigMap holds %d KiB: the operation %d KiB gzipped (%d KiB of JSON), the plan %d KiB gzipped (%d KiB of JSON)",
			nodes, size>>10, len(state.BinaryData[OperationKey])>>10, len(op)>>10, len(state.BinaryData[PlanKey])>>10, len(big.Plan)>>10)
		assert.Less(t, size, 1<<20, "the state of a %d-node upgrade fits in a ConfigMap", nodes)

		got, err := DecodeState(state)
		require.NoError(t, err)
		require.Len(t, got.Status.Nodes, nodes)
		again, err := json.Marshal(got)
		require.NoError(t, err)
		assert.JSONEq(t, string(op), string(again), "every node's step and timeline is kept")

		plan, err := StatePlan(state)
		require.NoError(t, err)
		assert.JSONEq(t, string(big.Plan), string(plan))
	}

	t.Logf("at this rate 1 MiB holds the state of about %d nodes", int(float64(1<<20)/perNode)/1000*1000)
}
