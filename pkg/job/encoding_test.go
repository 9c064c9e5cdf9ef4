package job

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
	"k8s.io/client-go/kubernetes/fake"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
)

func TestStateRoundTrip(t *testing.T) {
	op := testOperation("kubernetes-v1-36-3-abcde", api.PhaseRunning)
	SetNode(&op.Status, "APIServers", "cp-1", engine.PhaseApplying, "applying", t0)
	SetNode(&op.Status, "APIServers", "cp-1", engine.PhaseDone, "done", t0.Add(time.Minute))
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

// TestZipperReused: a compressor reset for each use gzips as a new one does, whatever it
// compressed before, and what it gives stays as it was after its next use.
func TestZipperReused(t *testing.T) {
	var z zipper

	inputs := [][]byte{[]byte(`{"kind":"Operation","long":"` + strings.Repeat("node-", 2000) + `"}`), []byte(`{}`), nil, []byte(`{"a":1}`)}
	blobs := make([][]byte, 0, len(inputs))

	for _, in := range inputs {
		want, err := gzipBytes(in)
		require.NoError(t, err)

		got, err := z.gzip(in)
		require.NoError(t, err)
		assert.Equal(t, want, got)

		blobs = append(blobs, got)
	}

	for i, blob := range blobs {
		raw, err := gunzip(blob)
		require.NoError(t, err)
		assert.Equal(t, string(inputs[i]), string(raw))
	}
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
		{
			name: "a path without hops", want: `spec.upgrade cluster has no spec.hops`,
			data: map[string][]byte{OperationKey: gz(`{"apiVersion":"ichor.dev/v1alpha1","kind":"Operation","spec":{"id":"x","upgrade":"cluster"},"status":{"phase":"Running"}}`)},
		},
		{
			name: "a hop of an unknown kind", want: `spec.hops[1]: unknown upgrade "os"`,
			data: map[string][]byte{OperationKey: gz(`{"apiVersion":"ichor.dev/v1alpha1","kind":"Operation","spec":{"id":"x","upgrade":"cluster",` +
				`"hops":[{"upgrade":"talos","to":"v1.14.1"},{"upgrade":"os","to":"v1.2.3"}]},"status":{"phase":"Running"}}`)},
		},
		{
			name: "a hop past the path", want: `status.hop 3 is not a hop of the 2 in spec.hops`,
			data: map[string][]byte{OperationKey: gz(`{"apiVersion":"ichor.dev/v1alpha1","kind":"Operation","spec":{"id":"x","upgrade":"cluster",` +
				`"hops":[{"upgrade":"talos","to":"v1.14.1"},{"upgrade":"kubernetes","to":"v1.35.4"}]},"status":{"phase":"Running","hop":3}}`)},
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

// TestStateWrittenByHand: a state that gives the Operation as plain JSON
// under data (manifests/) is read, and the first write gzips it.
func TestStateWrittenByHand(t *testing.T) {
	ctx := context.Background()

	cm, err := encodeStateJSON("ichor-system", testOperation("op-1", api.PhasePending))
	require.NoError(t, err)
	assert.Contains(t, cm.Data[OperationJSONKey], `"id": "op-1"`)
	assert.Empty(t, cm.BinaryData)

	store := &Store{Client: fake.NewClientset(cm).CoreV1(), Namespace: "ichor-system"}
	_, err = store.Update(ctx, func(op *api.Operation) error {
		assert.Equal(t, "op-1", op.Spec.ID)
		op.Status.Phase = api.PhaseRunning

		return nil
	})
	require.NoError(t, err)

	written, err := store.Client.ConfigMaps("ichor-system").Get(ctx, StateName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, written.Data, OperationJSONKey, "the plain form is replaced")
	assert.Contains(t, written.BinaryData, OperationKey)

	op, err := DecodeState(written)
	require.NoError(t, err)
	assert.Equal(t, api.PhaseRunning, op.Status.Phase)

	cm.Data[OperationJSONKey] = "{nope"
	_, err = DecodeState(cm)

	var corrupt *CorruptStateError
	require.ErrorAs(t, err, &corrupt)
	assert.Contains(t, err.Error(), "(operation.json: invalid character")
}
