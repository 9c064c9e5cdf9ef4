package job

import (
	"context"
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

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func testOperation(id string, phase api.Phase) *api.Operation {
	op := api.NewOperation(api.OperationSpec{
		ID: id, Upgrade: api.UpgradeKubernetes, Target: "v1.36.3", MaxUnavailable: 1,
		Image: "ghcr.io/ichor-dev/kubectl-ichor:v0.1.0", Credentials: api.CredentialsServiceAccount,
		CreatedAt: metav1.NewTime(t0),
	})
	op.Status.Phase = phase
	op.Status.Attempt = 1
	op.Status.Job = JobName(id, 1)

	return op
}

func stateObject(t *testing.T, op *api.Operation) *corev1.ConfigMap {
	t.Helper()

	cm, err := EncodeState("ichor-system", op, []byte(`{"kind":"Plan"}`))
	require.NoError(t, err)

	return cm
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
			old := testOperation("op-1", api.PhaseSucceeded)
			cm := stateObject(t, old)
			cm.BinaryData[PlanKey] = blob

			_, err := DecodeState(cm)
			require.NoError(t, err, "the operation itself reads")

			store := &Store{Client: fake.NewClientset(cm).CoreV1(), Namespace: "ichor-system"}

			_, planErr := store.Plan(ctx)
			_, findErr := store.Find(ctx, "op-1")
			createErr := store.Create(ctx, testOperation("op-2", api.PhasePending), nil, func(*api.Operation) error { return nil })

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
	op := testOperation("op-1", api.PhaseRunning)
	client := fake.NewClientset(stateObject(t, op))
	store := &Store{Client: client.CoreV1(), Namespace: "ichor-system", Now: func() time.Time { return t0 }}

	// Another writer adds a memo between each read and write: every retry must see it.
	memo := 0
	updates := conflicts(client, 2, func(cm *corev1.ConfigMap) {
		o, err := DecodeState(cm)
		require.NoError(t, err)

		memo++
		o.Status.Memo = map[string]string{"writer": strings.Repeat("x", memo)}
		require.NoError(t, writeOperation(cm, o, nil))
	})

	var seen []string

	got, err := store.Update(context.Background(), func(o *api.Operation) error {
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
	client := fake.NewClientset(stateObject(t, testOperation("op-1", api.PhaseRunning)))
	store := &Store{Client: client.CoreV1(), Namespace: "ichor-system"}

	conflicts(client, 1, func(cm *corev1.ConfigMap) {
		o, err := DecodeState(cm)
		require.NoError(t, err)

		o.Status.Phase = api.PhaseAborted
		require.NoError(t, writeOperation(cm, o, nil))
	})

	_, err := store.Update(context.Background(), func(o *api.Operation) error {
		if o.Status.Phase == api.PhaseAborted {
			return errAborted
		}

		o.Status.Phase = api.PhaseSucceeded

		return nil
	})
	require.ErrorIs(t, err, errAborted)

	stored, _, err := store.Get(context.Background())
	require.NoError(t, err)
	assert.Equal(t, api.PhaseAborted, stored.Status.Phase, "the abort is not overwritten")
}

func TestStoreUpdateGivesUp(t *testing.T) {
	client := fake.NewClientset(stateObject(t, testOperation("op-1", api.PhaseRunning)))
	store := &Store{Client: client.CoreV1(), Namespace: "ichor-system"}
	conflicts(client, 1000, nil)

	_, err := store.Update(context.Background(), func(*api.Operation) error { return nil })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "20 conflicts in a row")
}

func TestStoreCreate(t *testing.T) {
	ctx := context.Background()
	refuse := errors.New("busy")

	t.Run("new", func(t *testing.T) {
		store := &Store{Client: fake.NewClientset().CoreV1(), Namespace: "ichor-system"}
		require.NoError(t, store.Create(ctx, testOperation("op-2", api.PhasePending), []byte("{}"), func(*api.Operation) error { return refuse }))

		got, _, err := store.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, "op-2", got.Spec.ID)
	})

	t.Run("replaces what replace allows", func(t *testing.T) {
		store := &Store{Client: fake.NewClientset(stateObject(t, testOperation("op-1", api.PhaseSucceeded))).CoreV1(), Namespace: "ichor-system"}

		var old string

		require.NoError(t, store.Create(ctx, testOperation("op-2", api.PhasePending), nil, func(o *api.Operation) error { old = o.Spec.ID; return nil }))
		assert.Equal(t, "op-1", old)

		got, _, err := store.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, "op-2", got.Spec.ID)
	})

	t.Run("refused", func(t *testing.T) {
		store := &Store{Client: fake.NewClientset(stateObject(t, testOperation("op-1", api.PhaseRunning))).CoreV1(), Namespace: "ichor-system"}
		require.ErrorIs(t, store.Create(ctx, testOperation("op-2", api.PhasePending), nil, func(*api.Operation) error { return refuse }), refuse)

		got, _, err := store.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, "op-1", got.Spec.ID)
	})

	t.Run("a concurrent launch wins the replacement", func(t *testing.T) {
		client := fake.NewClientset(stateObject(t, testOperation("op-1", api.PhaseSucceeded)))
		store := &Store{Client: client.CoreV1(), Namespace: "ichor-system"}

		// op-3 replaces op-1 between our read and our write: we must look again and
		// be refused by op-3, not overwrite it.
		conflicts(client, 1, func(cm *corev1.ConfigMap) {
			require.NoError(t, writeOperation(cm, testOperation("op-3", api.PhasePending), nil))
		})

		var saw []string

		err := store.Create(ctx, testOperation("op-2", api.PhasePending), nil, func(o *api.Operation) error {
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

func TestStoreUpdateStartsFromItsLastWrite(t *testing.T) {
	client := fake.NewClientset(stateObject(t, testOperation("op-1", api.PhaseRunning)))
	withResourceVersions(client, configmapsResource)

	store := &Store{Client: client.CoreV1(), Namespace: "ichor-system"}

	for i := range 3 {
		_, err := store.Update(context.Background(), func(o *api.Operation) error {
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
	_, err := other.Update(context.Background(), func(o *api.Operation) error {
		o.Status.Phase = api.PhaseAborted

		return nil
	})
	require.NoError(t, err)

	_, err = store.Update(context.Background(), func(o *api.Operation) error {
		if o.Status.Phase == api.PhaseAborted {
			return errAborted
		}

		return nil
	})
	require.ErrorIs(t, err, errAborted)
}
