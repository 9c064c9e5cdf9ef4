package engine

import (
	"context"
	"encoding/json"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// This file carries the runner's last look at etcd over a hand-over. The successor
// starts from the state, and before it goes on it verifies the control planes already
// done, which wants a read of etcd: two passes a gap (a second) apart in a process that
// has read nothing before. The runner handing over reads one pass right before it asks
// for its successor and leaves it in Memo; the successor takes it as its own first pass
// (stages.EtcdChain.Seed), and its first read waits out only what is left of the gap.

// etcdPassKey is the Memo key of the pass a runner handing over leaves.
const etcdPassKey = "talos/etcd-pass"

// etcdHandOver is the Talos run's HandOver: it leaves a pass of etcd in Memo before
// asking for a successor.
type etcdHandOver struct {
	HandOver
	r *talosRun
}

// Prepare leaves the pass, then asks for the successor.
func (h etcdHandOver) Prepare(ctx context.Context) {
	h.r.leaveEtcdPass(ctx)
	h.HandOver.Prepare(ctx)
}

// leaveEtcdPass reads a pass of every control plane's member status and keeps it in
// Memo. A pass not every control plane answered, or not written, is left out: the
// successor then reads two passes, as any new runner.
func (r *talosRun) leaveEtcdPass(ctx context.Context) {
	if r.etcd == nil || len(r.etcdNodes) == 0 {
		return
	}

	p, ok := r.etcd.Latest(ctx)
	if !ok {
		return
	}

	b, err := json.Marshal(p)
	if err != nil {
		return
	}

	_ = r.e.Memo.Set(ctx, etcdPassKey, string(b))
}

// takeEtcdPass seeds the run's chain with the pass a runner that handed over left, when
// it can still serve (see stages.EtcdChain.Seed).
func (r *talosRun) takeEtcdPass() {
	v, ok := r.e.Memo.Get(etcdPassKey)
	if !ok || v == "" {
		return
	}

	var p stages.EtcdPass
	if json.Unmarshal([]byte(v), &p) == nil {
		r.etcd.Seed(p)
	}
}
