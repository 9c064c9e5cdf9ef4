package engine

import (
	"context"
	"encoding/json"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// This file carries a look at etcd into a runner that has read nothing yet. Its first
// read of etcd (the look before the first control plane's cordon; for a successor, the
// verification of the control planes already done) wants two passes a gap (a second)
// apart. Passes read a moment before elsewhere serve as its first (stages.EtcdChain.Seed),
// and the read waits out only what is left of the gap:
//
//   - the plan's two passes, which the launch puts in the state (EtcdPassMemo);
//   - a runner handing over reads one pass right before it asks for its successor (and
//     again right before it hands over, when it stayed through its node's install),
//     and leaves its passes in Memo (etcdHandOver).

// etcdPassKey is the Memo key of the passes left for the next runner.
const etcdPassKey = "talos/etcd-passes"

// EtcdPassMemo is the Memo that hands passes (the plan's) to the first runner; nil
// when there are none.
func EtcdPassMemo(passes []stages.EtcdPass) map[string]string {
	if len(passes) == 0 {
		return nil
	}

	b, err := json.Marshal(passes)
	if err != nil {
		return nil
	}

	return map[string]string{etcdPassKey: string(b)}
}

// etcdHandOver is the Talos run's HandOver: it leaves a pass of etcd in Memo before
// asking for a successor.
type etcdHandOver struct {
	HandOver
	r *talosRun
}

// Prepare leaves the passes, then asks for the successor. It is called at the drain
// of the runner's node and again right before the hand-over when the runner stays
// through the node's install: the successor's first read takes whichever pass lets
// it read soonest (see stages.EtcdChain.Seed).
func (h etcdHandOver) Prepare(ctx context.Context) {
	h.r.leaveEtcdPasses(ctx)
	h.HandOver.Prepare(ctx)
}

// leaveEtcdPasses reads a pass of every control plane's member status and keeps the
// chain's passes in Memo. Passes not every control plane answered, or not written, are
// left out: the successor then reads two passes, as any new runner.
func (r *talosRun) leaveEtcdPasses(ctx context.Context) {
	if r.etcd == nil || len(r.etcdNodes) == 0 {
		return
	}

	r.etcd.Pass(ctx, "")

	for k, v := range EtcdPassMemo(r.etcd.Passes()) {
		_ = r.e.Memo.Set(ctx, k, v)
	}
}

// takeEtcdPasses seeds the run's chain with the passes left for it, those that can
// still serve (see stages.EtcdChain.Seed).
func (r *talosRun) takeEtcdPasses() {
	v, ok := r.e.Memo.Get(etcdPassKey)
	if !ok || v == "" {
		return
	}

	var passes []stages.EtcdPass
	if json.Unmarshal([]byte(v), &passes) == nil {
		r.etcd.Seed(passes...)
	}
}
