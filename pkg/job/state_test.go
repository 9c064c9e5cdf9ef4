package job

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func testOperation(id string, phase Phase) *Operation {
	op := NewOperation(OperationSpec{
		ID: id, Upgrade: engine.KindKubernetes, Target: "v1.36.3", MaxUnavailable: 1,
		Image: "ghcr.io/ichor-dev/kubectl-ichor:v0.1.0", Credentials: CredentialsServiceAccount,
		CreatedAt: metav1.NewTime(t0),
	})
	op.Status.Phase = phase
	op.Status.Attempt = 1
	op.Status.Job = JobName(id, 1)

	return op
}

func stateObject(t *testing.T, op *Operation) *corev1.ConfigMap {
	t.Helper()

	cm, err := EncodeState("ichor-system", op, []byte(`{"kind":"Plan"}`))
	require.NoError(t, err)

	return cm
}

func TestStateRoundTrip(t *testing.T) {
	op := testOperation("kubernetes-v1-36-3-abcde", PhaseRunning)
	op.Status.SetNode("APIServers", "cp-1", engine.PhaseApplying, "applying", t0)
	op.Status.SetNode("APIServers", "cp-1", engine.PhaseDone, "done", t0.Add(time.Minute))
	op.Status.Memo = map[string]string{"boot/cp-1": "abc"}

	cm := stateObject(t, op)
	assert.Equal(t, "Running", cm.Labels[LabelPhase])
	assert.Equal(t, "kubernetes-v1-36-3-abcde", cm.Labels[LabelOperation])
	assert.Empty(t, cm.Data, "everything is gzipped in binaryData")

	plan, err := StatePlan(cm)
	require.NoError(t, err)
	assert.Equal(t, `{"kind":"Plan"}`, string(plan))

	got, err := DecodeState(cm)
	require.NoError(t, err)

	want, _ := json.Marshal(op)
	again, _ := json.Marshal(got)
	assert.JSONEq(t, string(want), string(again))
	require.Len(t, got.Status.Nodes, 1)
	assert.True(t, t0.Add(time.Minute).Equal(got.Status.Nodes[0].Since.Time), "a phase change restarts the node's clock")
}

func TestCorruptState(t *testing.T) {
	gz := func(s string) []byte {
		b, err := gzipBytes([]byte(s))
		require.NoError(t, err)

		return b
	}

	tests := []struct {
		name string
		data map[string][]byte
		want string
	}{
		{name: "no key", data: map[string][]byte{"other": []byte("x")}, want: "no key operation.json.gz"},
		{name: "not gzipped", data: map[string][]byte{OperationKey: []byte(`{"apiVersion":"ichor.dev/v1alpha1"}`)}, want: "operation.json.gz: gzip: invalid header"},
		{name: "not JSON", data: map[string][]byte{OperationKey: gz("{nope")}, want: "operation.json.gz: invalid character"},
		{name: "wrong kind", data: map[string][]byte{OperationKey: gz(`{"apiVersion":"v1","kind":"Pod"}`)}, want: "is a v1 Pod, want ichor.dev/v1alpha1 Operation"},
		{name: "no id", data: map[string][]byte{OperationKey: gz(`{"apiVersion":"ichor.dev/v1alpha1","kind":"Operation","status":{"phase":"Running"}}`)}, want: "no spec.id"},
		{
			name: "unknown phase", want: `unknown status.phase "Exploded"`,
			data: map[string][]byte{OperationKey: gz(`{"apiVersion":"ichor.dev/v1alpha1","kind":"Operation","spec":{"id":"x","upgrade":"kubernetes"},"status":{"phase":"Exploded"}}`)},
		},
		{
			name: "unknown kind of upgrade", want: `unknown spec.upgrade "os"`,
			data: map[string][]byte{OperationKey: gz(`{"apiVersion":"ichor.dev/v1alpha1","kind":"Operation","spec":{"id":"x","upgrade":"os"},"status":{"phase":"Running"}}`)},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: StateName, Namespace: "ichor-system"}, BinaryData: tt.data}
			_, err := DecodeState(cm)

			var corrupt *CorruptStateError
			require.ErrorAs(t, err, &corrupt)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), "state configmap ichor-system/ichor-state is corrupted")
			assert.Contains(t, err.Error(), "kubectl ichor abort")
			assert.NotContains(t, err.Error(), "\n", "one line")
		})
	}

	store := &Store{Client: fake.NewClientset().CoreV1(), Namespace: "ichor-system"}
	_, _, err := store.Get(context.Background())
	require.ErrorIs(t, err, ErrNoOperation)
	assert.Contains(t, err.Error(), "no operation in namespace ichor-system: start one with kubectl ichor upgrade")
}

// TestCorruptPlan: the operation reads, but its plan does not; every reader
// of the plan says so on one line, with what to do.
func TestCorruptPlan(t *testing.T) {
	ctx := context.Background()

	for name, blob := range map[string][]byte{
		"not gzipped": []byte(`{"kind":"Plan"}`),
		"not JSON":    func() []byte { b, _ := gzipBytes([]byte("{nope")); return b }(),
	} {
		t.Run(name, func(t *testing.T) {
			old := testOperation("op-1", PhaseSucceeded)
			cm := stateObject(t, old)
			cm.BinaryData[PlanKey] = blob

			_, err := DecodeState(cm)
			require.NoError(t, err, "the operation itself reads")

			store := &Store{Client: fake.NewClientset(cm).CoreV1(), Namespace: "ichor-system"}

			_, planErr := store.Plan(ctx)
			_, findErr := store.Find(ctx, "op-1")
			createErr := store.Create(ctx, testOperation("op-2", PhasePending), nil, func(*Operation) error { return nil })

			for _, err := range []error{planErr, findErr, createErr} {
				var corrupt *CorruptStateError
				require.ErrorAs(t, err, &corrupt)
				assert.Contains(t, err.Error(), "state configmap ichor-system/ichor-state is corrupted (plan.json.gz: ")
				assert.Contains(t, err.Error(), "kubectl delete configmap -n ichor-system ichor-state")
				assert.NotContains(t, err.Error(), "\n", "one line")
			}

			op, _, err := store.Get(ctx)
			require.NoError(t, err)
			assert.Equal(t, "op-1", op.Spec.ID, "a launch over it is refused, the state left as is")
		})
	}
}

// conflicts makes the first n updates of the state ConfigMap fail with a conflict, each
// after another writer changed it (before changes the stored object).
func conflicts(client *fake.Clientset, n int, before func(cm *corev1.ConfigMap)) *int {
	updates := 0

	client.PrependReactor("update", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		updates++
		if updates > n {
			return false, nil, nil
		}

		if before != nil {
			cm, err := client.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "ichor-system", StateName)
			if err != nil {
				return true, nil, err
			}

			c := cm.(*corev1.ConfigMap).DeepCopy()
			before(c)

			if err := client.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, c, "ichor-system"); err != nil {
				return true, nil, err
			}
		}

		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, StateName, errors.New("the object has been modified"))
	})

	return &updates
}

func TestStoreUpdateRereadsOnConflict(t *testing.T) {
	op := testOperation("op-1", PhaseRunning)
	client := fake.NewClientset(stateObject(t, op))
	store := &Store{Client: client.CoreV1(), Namespace: "ichor-system", Now: func() time.Time { return t0 }}

	// Another writer adds a memo between each read and write: every retry must see it.
	memo := 0
	updates := conflicts(client, 2, func(cm *corev1.ConfigMap) {
		o, err := DecodeState(cm)
		require.NoError(t, err)

		memo++
		o.Status.Memo = map[string]string{"writer": strings.Repeat("x", memo)}
		require.NoError(t, writeOperation(cm, o))
	})

	var seen []string

	got, err := store.Update(context.Background(), func(o *Operation) error {
		seen = append(seen, o.Status.Memo["writer"])
		o.Status.Stage = "Kubelets"

		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 3, *updates)
	assert.Equal(t, []string{"", "x", "xx"}, seen, "each attempt starts from a fresh read")
	assert.Equal(t, "Kubelets", got.Status.Stage)

	stored, _, err := store.Get(context.Background())
	require.NoError(t, err)
	assert.Equal(t, "Kubelets", stored.Status.Stage)
	assert.Equal(t, "xx", stored.Status.Memo["writer"], "the other writer's change is kept")
	assert.True(t, t0.Equal(stored.Status.UpdatedAt.Time))
}

func TestStoreUpdateSeesAnAbortInBetween(t *testing.T) {
	client := fake.NewClientset(stateObject(t, testOperation("op-1", PhaseRunning)))
	store := &Store{Client: client.CoreV1(), Namespace: "ichor-system"}

	conflicts(client, 1, func(cm *corev1.ConfigMap) {
		o, err := DecodeState(cm)
		require.NoError(t, err)

		o.Status.Phase = PhaseAborted
		require.NoError(t, writeOperation(cm, o))
	})

	_, err := store.Update(context.Background(), func(o *Operation) error {
		if o.Status.Phase == PhaseAborted {
			return errAborted
		}

		o.Status.Phase = PhaseSucceeded

		return nil
	})
	require.ErrorIs(t, err, errAborted)

	stored, _, err := store.Get(context.Background())
	require.NoError(t, err)
	assert.Equal(t, PhaseAborted, stored.Status.Phase, "the abort is not overwritten")
}

func TestStoreUpdateGivesUp(t *testing.T) {
	client := fake.NewClientset(stateObject(t, testOperation("op-1", PhaseRunning)))
	store := &Store{Client: client.CoreV1(), Namespace: "ichor-system"}
	conflicts(client, 1000, nil)

	_, err := store.Update(context.Background(), func(*Operation) error { return nil })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "20 conflicts in a row")
}

func TestStoreCreate(t *testing.T) {
	ctx := context.Background()
	refuse := errors.New("busy")

	t.Run("new", func(t *testing.T) {
		store := &Store{Client: fake.NewClientset().CoreV1(), Namespace: "ichor-system"}
		require.NoError(t, store.Create(ctx, testOperation("op-2", PhasePending), []byte("{}"), func(*Operation) error { return refuse }))

		got, _, err := store.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, "op-2", got.Spec.ID)
	})

	t.Run("replaces what replace allows", func(t *testing.T) {
		store := &Store{Client: fake.NewClientset(stateObject(t, testOperation("op-1", PhaseSucceeded))).CoreV1(), Namespace: "ichor-system"}

		var old string

		require.NoError(t, store.Create(ctx, testOperation("op-2", PhasePending), nil, func(o *Operation) error { old = o.Spec.ID; return nil }))
		assert.Equal(t, "op-1", old)

		got, _, err := store.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, "op-2", got.Spec.ID)
	})

	t.Run("refused", func(t *testing.T) {
		store := &Store{Client: fake.NewClientset(stateObject(t, testOperation("op-1", PhaseRunning))).CoreV1(), Namespace: "ichor-system"}
		require.ErrorIs(t, store.Create(ctx, testOperation("op-2", PhasePending), nil, func(*Operation) error { return refuse }), refuse)

		got, _, err := store.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, "op-1", got.Spec.ID)
	})

	t.Run("a concurrent launch wins the replacement", func(t *testing.T) {
		client := fake.NewClientset(stateObject(t, testOperation("op-1", PhaseSucceeded)))
		store := &Store{Client: client.CoreV1(), Namespace: "ichor-system"}

		// op-3 replaces op-1 between our read and our write: we must look again and
		// be refused by op-3, not overwrite it.
		conflicts(client, 1, func(cm *corev1.ConfigMap) {
			require.NoError(t, writeOperation(cm, testOperation("op-3", PhasePending)))
		})

		var saw []string

		err := store.Create(ctx, testOperation("op-2", PhasePending), nil, func(o *Operation) error {
			saw = append(saw, o.Spec.ID)
			if o.Status.Phase.Finished() {
				return nil
			}

			return refuse
		})
		require.ErrorIs(t, err, refuse)
		assert.Equal(t, []string{"op-1", "op-3"}, saw)
	})
}

func TestSetNodeTimeline(t *testing.T) {
	s := OperationStatus{Phase: PhaseRunning}

	at := func(d time.Duration) *metav1.MicroTime {
		mt := metav1.NewMicroTime(t0.Add(d).UTC())

		return &mt
	}

	s.SetNode("APIServers", "cp-1", engine.PhasePending, "to apply", t0)
	s.SetNode("APIServers", "cp-1", engine.PhaseApplying, "dry run", t0.Add(1500*time.Microsecond))
	s.SetNode("APIServers", "cp-1", engine.PhaseApplying, "applying", t0.Add(time.Second))
	s.SetNode("APIServers", "cp-1", engine.PhaseVerifying, "waiting", t0.Add(2*time.Second))
	s.SetNode("APIServers", "cp-1", engine.PhaseDone, "done", t0.Add(3*time.Second))
	// A runner that takes over verifies the node again: the first times stay.
	s.SetNode("APIServers", "cp-1", engine.PhaseDone, "already applied", t0.Add(time.Minute))
	s.SetNode("ControlPlaneComponents", "cp-1", engine.PhaseDone, "already applied", t0.Add(2*time.Minute))

	require.Len(t, s.Nodes, 1)
	assert.Equal(t, []NodeStageTimes{
		{Stage: "APIServers", ApplyStarted: at(1500 * time.Microsecond), Done: at(3 * time.Second)},
		{Stage: "ControlPlaneComponents", Done: at(2 * time.Minute)},
	}, s.Nodes[0].Timeline)

	// The times survive the ConfigMap to the microsecond.
	op := testOperation("kubernetes-v1-36-3-abcde", PhaseRunning)
	op.Status = s

	got, err := DecodeState(stateObject(t, op))
	require.NoError(t, err)
	assert.True(t, got.Status.Nodes[0].Timeline[0].ApplyStarted.Equal(at(1500*time.Microsecond)))
}

func TestStoreUpdateStartsFromItsLastWrite(t *testing.T) {
	client := fake.NewClientset(stateObject(t, testOperation("op-1", PhaseRunning)))
	withResourceVersions(client, configmapsResource)

	store := &Store{Client: client.CoreV1(), Namespace: "ichor-system"}

	for i := range 3 {
		_, err := store.Update(context.Background(), func(o *Operation) error {
			o.Status.Runs = i + 1

			return nil
		})
		require.NoError(t, err)
	}

	gets := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "get" {
			gets++
		}
	}

	assert.Equal(t, 1, gets, "one read for three writes")

	// Another writer in between: the stale start conflicts and is read again.
	other := &Store{Client: client.CoreV1(), Namespace: "ichor-system"}
	_, err := other.Update(context.Background(), func(o *Operation) error {
		o.Status.Phase = PhaseAborted

		return nil
	})
	require.NoError(t, err)

	_, err = store.Update(context.Background(), func(o *Operation) error {
		if o.Status.Phase == PhaseAborted {
			return errAborted
		}

		return nil
	})
	require.ErrorIs(t, err, errAborted)
}

func TestStepRecords(t *testing.T) {
	var s OperationStatus

	s.SetStep("KubeProxy", engine.StepManifests, engine.StepTiming{Done: true}, t0)
	s.SetStep("KubeProxy", engine.StepManifests, engine.StepTiming{Done: true}, t0.Add(2*time.Second))
	s.SetStep("KubeProxy", engine.StepRollout, engine.StepTiming{Pods: 5, Updated: 1, MaxUnavailable: 1}, t0.Add(3*time.Second))
	s.SetStep("KubeProxy", engine.StepRollout, engine.StepTiming{}, t0.Add(4*time.Second))
	s.SetStep("KubeProxy", engine.StepRollout, engine.StepTiming{Done: true, Pods: 5, Updated: 5, MaxUnavailable: 1}, t0.Add(9*time.Second))

	require.Len(t, s.Steps, 2, "one record per stage and step")

	m := s.StepOf("KubeProxy", engine.StepManifests)
	require.NotNil(t, m)
	assert.Equal(t, t0, m.Started.Time, "the first start")
	assert.Equal(t, t0.Add(2*time.Second), m.Done.Time, "the last done: once per control plane")

	r := s.StepOf("KubeProxy", engine.StepRollout)
	require.NotNil(t, r)
	assert.Equal(t, t0.Add(3*time.Second), r.Started.Time)
	assert.Equal(t, 5, r.Updated)
	assert.Equal(t, t0.Add(9*time.Second), r.Observed.Time)
	assert.Nil(t, s.StepOf("Kubelets", engine.StepRollout))
}

func TestRunnerRecords(t *testing.T) {
	var s OperationStatus

	s.StartRunner("pod-1", "worker-1", false, t0, t0.Add(2*time.Second))
	s.EndRunner(t0.Add(10 * time.Second))
	s.StartRunner("pod-2", "cp-1", false, t0, t0.Add(21*time.Second))

	// A runner that died without a word: idle since the last write.
	updated := metav1.NewTime(t0.Add(30 * time.Second))
	s.UpdatedAt = &updated
	s.StartRunner("pod-3", "cp-2", true, t0, t0.Add(40*time.Second))

	require.Len(t, s.Runners, 3)
	assert.Equal(t, t0, s.Runners[0].Idle.Time, "the first runner waited from the launch")
	assert.Equal(t, t0.Add(10*time.Second), s.Runners[1].Idle.Time, "the next from the previous one's end")
	assert.Equal(t, t0.Add(30*time.Second), s.Runners[2].Idle.Time, "or from its last write")
	assert.True(t, s.Runners[2].AfterPause)

	// The first runner waits from the launch to the microsecond when known.
	launched := metav1.NewMicroTime(t0.Add(300 * time.Millisecond))
	fresh := OperationStatus{LaunchedAt: &launched}
	fresh.StartRunner("pod-1", "worker-1", false, t0, t0.Add(2*time.Second))
	assert.Equal(t, launched.Time, fresh.Runners[0].Idle.Time)
	assert.Equal(t, "cp-1", s.Runners[1].Node)

	for i := range MaxRunners + 5 {
		s.StartRunner("pod", "cp-1", false, t0, t0.Add(time.Duration(i)*time.Minute))
	}

	assert.Len(t, s.Runners, MaxRunners, "bounded")
}

// TestStateWrittenByHand: a state that gives the Operation as plain JSON
// under data (manifests/) is read, and the first write gzips it.
func TestStateWrittenByHand(t *testing.T) {
	ctx := context.Background()

	cm, err := encodeStateJSON("ichor-system", testOperation("op-1", PhasePending))
	require.NoError(t, err)
	assert.Contains(t, cm.Data[OperationJSONKey], `"id": "op-1"`)
	assert.Empty(t, cm.BinaryData)

	store := &Store{Client: fake.NewClientset(cm).CoreV1(), Namespace: "ichor-system"}
	_, err = store.Update(ctx, func(op *Operation) error {
		assert.Equal(t, "op-1", op.Spec.ID)
		op.Status.Phase = PhaseRunning

		return nil
	})
	require.NoError(t, err)

	written, err := store.Client.ConfigMaps("ichor-system").Get(ctx, StateName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, written.Data, OperationJSONKey, "the plain form is replaced")
	assert.Contains(t, written.BinaryData, OperationKey)

	op, err := DecodeState(written)
	require.NoError(t, err)
	assert.Equal(t, PhaseRunning, op.Status.Phase)

	cm.Data[OperationJSONKey] = "{nope"
	_, err = DecodeState(cm)

	var corrupt *CorruptStateError
	require.ErrorAs(t, err, &corrupt)
	assert.Contains(t, err.Error(), "(operation.json: invalid character")
}
