package engine

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// passHandOver is a HandOver that never finds a successor and records, at each
// Prepare, whether the run had left its etcd pass in memo by then.
type passHandOver struct {
	memo *mapMemo

	mu   sync.Mutex
	left []bool
}

func (h *passHandOver) Prepare(context.Context) {
	_, ok := h.memo.Get(etcdPassKey)

	h.mu.Lock()
	defer h.mu.Unlock()

	h.left = append(h.left, ok)
}

func (h *passHandOver) Complete(context.Context) bool { return false }

// TestTalosHandOverLeavesAnEtcdPass: before the runner asks for a successor, it
// leaves in Memo a pass of every control plane's etcd status.
func TestTalosHandOverLeavesAnEtcdPass(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	memo := newMemo()
	h := &passHandOver{memo: memo}
	runnerPod(t, o.f, "worker-1", "ichor-run-abcde")

	e := o.engine("v1.13.9", memo, func(opts *Options) {
		opts.Self, opts.SelfPod, opts.HandOver = "worker-1", "ichor-system/ichor-run-abcde", h
	})
	require.NoError(t, e.Run(context.Background()))

	h.mu.Lock()
	assert.NotEmpty(t, h.left, "the hand-over was asked for")
	assert.NotContains(t, h.left, false, "the pass was left before each ask")
	h.mu.Unlock()

	v, ok := memo.Get(etcdPassKey)
	require.True(t, ok)

	var passes []stages.EtcdPass
	require.NoError(t, json.Unmarshal([]byte(v), &passes))
	require.NotEmpty(t, passes)
	p := passes[len(passes)-1]
	assert.Len(t, p.Status, 3)
	assert.Contains(t, p.Status, "cp-1")
	assert.False(t, p.Ended.Before(p.Begun))
}

// TestTalosSuccessorTakesTheEtcdPass: a run that finds a pass left a moment ago
// (by the plan, or a runner that handed over)
// takes it as its first etcd read's first pass, and reads one pass; a pass left
// long ago is not taken.
func TestTalosSuccessorTakesTheEtcdPass(t *testing.T) {
	left := stages.EtcdPass{Status: map[string]talos.EtcdStatus{}}
	for i, cp := range []string{"cp-1", "cp-2", "cp-3"} {
		left.Status[cp] = talos.EtcdStatus{MemberID: uint64(i + 1), Leader: 1, RaftIndex: 4000, RaftTerm: 2}
	}

	for _, tt := range []struct {
		name  string
		age   time.Duration
		taken bool
	}{
		{"left a moment ago", 1200 * time.Millisecond, true},
		{"left long ago", time.Hour, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := newFakeOS(t, talosSpec())
			memo := newMemo()

			p := left
			p.Begun, p.Ended = time.Now().Add(-tt.age), time.Now().Add(-tt.age+10*time.Millisecond)
			for k, v := range EtcdPassMemo([]stages.EtcdPass{p}) {
				require.NoError(t, memo.Set(context.Background(), k, v))
			}

			e := o.engine("v1.13.9", memo)
			e.etcdGap = time.Second
			r := &talosRun{e: e, opts: e.Options, etcdNodes: []stages.EtcdNode{{Name: "cp-1", IP: "10.0.0.11"}, {Name: "cp-2", IP: "10.0.0.12"}, {Name: "cp-3", IP: "10.0.0.13"}}}
			r.etcd = &stages.EtcdChain{Reader: o, ControlPlanes: r.etcdNodes, Gap: e.etcdGap}
			r.takeEtcdPasses()

			v := r.readEtcd(context.Background())
			assert.Equal(t, tt.taken, assert.ObjectsAreEqual(left.Status, v.Before), "the left pass is the first: %v", v.Before)
			assert.True(t, v.Judge("cp-1").Healthy(), v.Judge("cp-1").Describe())
		})
	}
}
