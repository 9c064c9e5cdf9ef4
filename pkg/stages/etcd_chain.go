package stages

import (
	"context"
	"sync"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// EtcdChain reads etcd again and again through the same control planes, as
// a Talos upgrade does (before a control plane's cordon, before its install,
// before its reboot, while it rejoins), each read judged on two passes like
// ReadEtcdProgress. A read that comes soon after others takes one of their
// passes as its first: it waits out what is left of the gap after that pass,
// if anything, and reads one pass. So back-to-back reads cost one pass each,
// not a gap and two passes. The earlier pass:
//
//   - counts only when every control plane it asked answered it: every
//     control plane, or (Pass) all but one rebooting, with the leader among
//     them; a read asks every control plane again;
//   - ended at least a gap before the new pass, as ReadEtcdProgress's passes
//     are apart;
//   - began at most two gaps before the new pass. A member is judged on what
//     the leader had committed when the earlier pass was read, so a member
//     that stalled after that pass passes this read (a fresh two-pass read
//     lets a stall of up to a gap and its calls' time pass); two gaps bound
//     that, and the next read, before the reboot or at the member's return,
//     judges it on a later pass.
//
// Of the passes kept (both passes of a two-pass read, the last of a chained
// one, Pass's), the read takes the one its new pass can start soonest after, the
// latest of those. Between a control plane's look before its cordon, the gate
// before its install and the one before its reboot, a cordon and drain or an
// install shorter than a gap then cost no wait: the pass a gap before the
// last one serves. Otherwise the read is a whole ReadEtcdProgress. Reads are
// one at a time: a second caller waits for the first's read to end, then
// reads its own.
//
// Recent gives a caller that only looks (before a node's cordon, at a
// rebooted member's return) the last view itself when its second pass began
// within a gap: a new read, by the time it ended, would rest on a first pass
// as old. The gates right before an install or a reboot always Read.
type EtcdChain struct {
	// Reader and ControlPlanes are what every read asks.
	Reader        EtcdReader
	ControlPlanes []EtcdNode
	// Gap is the least time between two passes (EtcdProgressGap unless set).
	Gap time.Duration

	mu sync.Mutex
	// passes are the passes kept for a later read's first, oldest first:
	// every control plane answered each, and each began recently enough to
	// serve (pruned in keep).
	passes []etcdPass
	// view is the latest read's view when its second pass is the last of
	// passes and its member list and alarms were read too; viewBegun when
	// that pass began.
	view      *EtcdView
	viewBegun time.Time
	now       func() time.Time
	sleep     func(context.Context, time.Duration)
}

// etcdPass is one pass of status calls: what every control plane answered,
// when the calls began and when the pass (for a read's second pass, the whole
// read) ended.
type etcdPass struct {
	status       map[string]talos.EtcdStatus
	begun, ended time.Time
}

// Recent is the last view when every control plane answered its second
// pass, the member list and the alarms were read, and that pass began within
// a gap; else a Read.
func (c *EtcdChain) Recent(ctx context.Context) *EtcdView {
	c.mu.Lock()

	now, _ := c.clock()
	if c.view != nil && now().Sub(c.viewBegun) <= c.gap() {
		defer c.mu.Unlock()

		return c.view
	}

	c.mu.Unlock()

	return c.Read(ctx)
}

func (c *EtcdChain) gap() time.Duration {
	if c.Gap <= 0 {
		return EtcdProgressGap
	}

	return c.Gap
}

// Read is one view of etcd, as ReadEtcdProgress gives, on the chain.
func (c *EtcdChain) Read(ctx context.Context) *EtcdView {
	c.mu.Lock()
	defer c.mu.Unlock()

	gap := c.gap()
	now, wait := c.clock()

	if first, start, ok := c.pick(now(), gap); ok {
		if rest := start.Sub(now()); rest > 0 {
			wait(ctx, rest)
		}

		begun := now()
		v := readEtcdAfter(ctx, c.Reader, c.ControlPlanes, first.status, nil, begun.Sub(first.ended).Round(10*time.Millisecond))
		c.keep(v, etcdPass{status: v.Status, begun: begun, ended: now()}, gap)

		return v
	}

	begun := now()
	before, failed := readEtcdStatuses(ctx, c.Reader, c.ControlPlanes)
	c.keep(nil, etcdPass{status: before, begun: begun, ended: now()}, gap)

	wait(ctx, gap)

	begun = now()
	v := readEtcdAfter(ctx, c.Reader, c.ControlPlanes, before, failed, gap)
	c.keep(v, etcdPass{status: v.Status, begun: begun, ended: now()}, gap)

	return v
}

// pick chooses the kept pass a read at now takes as its first (see
// EtcdChain), and when its new pass starts: at now, or once a gap has passed
// since the chosen pass ended. ok is false when no kept pass can serve.
func (c *EtcdChain) pick(now time.Time, gap time.Duration) (first etcdPass, start time.Time, ok bool) {
	for i := len(c.passes) - 1; i >= 0; i-- {
		p := c.passes[i]

		at := now
		if ready := p.ended.Add(gap); ready.After(at) {
			at = ready
		}

		if at.Sub(p.begun) > 2*gap {
			continue
		}

		if !ok || at.Before(start) {
			first, start, ok = p, at, true
		}
	}

	return first, start, ok
}

// Pass reads one pass of every control plane's member status but down's
// (a control plane rebooting: its Talos API does not answer), and keeps it
// for a later read's first when every control plane asked answered and the
// leader is among them: a later read asks down again, and judges its member
// on what the leader had committed at this pass. Read while a control plane
// reboots, such passes let the read at its return, once its member answers,
// judge it in one pass, without a gap's wait after it.
func (c *EtcdChain) Pass(ctx context.Context, down string) {
	c.mu.Lock()
	defer c.mu.Unlock()

	asked := make([]EtcdNode, 0, len(c.ControlPlanes))

	for _, n := range c.ControlPlanes {
		if n.Name != down {
			asked = append(asked, n)
		}
	}

	now, _ := c.clock()
	begun := now()
	status, failed := readEtcdStatuses(ctx, c.Reader, asked)

	if len(failed) > 0 || len(status) != len(asked) || !hasLeader(status) {
		return
	}

	c.add(etcdPass{status: status, begun: begun, ended: now()}, c.gap())
}

// PassEvery reads a Pass without down every gap, each begun a gap after the
// one before (at once when a pass took longer), until ctx ends. Each pass's
// calls are bounded (etcdCallTimeout).
func (c *EtcdChain) PassEvery(ctx context.Context, down string) {
	now, wait := c.clock()

	for ctx.Err() == nil {
		begun := now()
		c.Pass(ctx, down)
		wait(ctx, begun.Add(c.gap()).Sub(now()))
	}
}

// hasLeader reports whether one of the statuses is the leader's own.
func hasLeader(status map[string]talos.EtcdStatus) bool {
	for _, s := range status {
		if s.Leader != 0 && s.Leader == s.MemberID {
			return true
		}
	}

	return false
}

// keep records a pass of a read for later reads when every control plane
// answered it (add); a pass a member did not answer is not kept, and the
// passes before it stay: a later read asks that member again. v is the
// read's view when p is its second pass (nil for a first): Recent gives it
// when its member list and alarms were read too.
func (c *EtcdChain) keep(v *EtcdView, p etcdPass, gap time.Duration) {
	if v != nil {
		c.view = nil
	}

	if len(p.status) != len(c.ControlPlanes) || (v != nil && len(v.StatusErr) > 0) {
		return
	}

	c.add(p, gap)

	if v != nil && v.ListErr == nil && v.AlarmsErr == nil {
		c.view, c.viewBegun = v, p.begun
	}
}

// add keeps p, and drops the passes no later read can take: those begun
// more than two gaps before p ended.
func (c *EtcdChain) add(p etcdPass, gap time.Duration) {
	kept := c.passes[:0]

	for _, old := range c.passes {
		if p.ended.Sub(old.begun) <= 2*gap {
			kept = append(kept, old)
		}
	}

	c.passes = append(kept, p)
}

// clock is the chain's time and its wait (a test's own, else the wall's).
func (c *EtcdChain) clock() (func() time.Time, func(context.Context, time.Duration)) {
	now, wait := c.now, c.sleep
	if now == nil {
		now = time.Now
	}

	if wait == nil {
		wait = func(ctx context.Context, d time.Duration) {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
	}

	return now, wait
}

// EtcdPass is one pass of a chain as another process can take it up: every
// control plane's member status by Node name, and when the pass's calls began
// and ended (wall-clock times, which cross processes; see Seed).
type EtcdPass struct {
	Status map[string]talos.EtcdStatus `json:"status"`
	Begun  time.Time                   `json:"begun"`
	Ended  time.Time                   `json:"ended"`
}

// Passes are the chain's kept passes that every control plane answered,
// oldest first: what another process's chain can take up (Seed).
func (c *EtcdChain) Passes() []EtcdPass {
	c.mu.Lock()
	defer c.mu.Unlock()

	var out []EtcdPass

	for _, p := range c.passes {
		if len(p.status) == len(c.ControlPlanes) {
			out = append(out, EtcdPass{Status: p.status, Begun: p.begun, Ended: p.ended})
		}
	}

	return out
}

// Seed keeps each of passes that another process read (the plan before the
// launch, a runner handing over to this one) as a kept pass of the chain's
// own, when it can serve a read: it holds a status of every control plane of
// the chain and the leader's among them, it ended before now, and it began at
// most two gaps before now. It returns how many it kept.
//
// The passes' times are the other process's clock, so Seed rests on the
// clocks agreeing (Talos keeps its nodes' by NTP; an operator's machine
// usually is too). A pass from a clock behind looks older than it is: the read
// that takes it has a shorter true gap, which can make a member look behind
// (a refusal), never hide one. From a clock ahead by more than its age it
// looks to end in the future and is not kept; ahead by less, it serves up to
// that much older than two gaps.
func (c *EtcdChain) Seed(passes ...EtcdPass) int {
	c.mu.Lock()
	defer c.mu.Unlock()

	now, _ := c.clock()
	gap := c.gap()
	kept := 0

	for _, p := range passes {
		if c.serves(p, now(), gap) {
			c.add(etcdPass{status: p.Status, begun: p.Begun, ended: p.Ended}, gap)
			kept++
		}
	}

	return kept
}

// serves reports whether p, read elsewhere, can serve a read of the chain at now.
func (c *EtcdChain) serves(p EtcdPass, now time.Time, gap time.Duration) bool {
	if p.Begun.IsZero() || p.Ended.Before(p.Begun) || p.Ended.After(now) || now.Sub(p.Begun) > 2*gap || !hasLeader(p.Status) {
		return false
	}

	for _, n := range c.ControlPlanes {
		if _, ok := p.Status[n.Name]; !ok {
			return false
		}
	}

	return len(p.Status) == len(c.ControlPlanes)
}
