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
// ReadEtcdProgress. A read that comes soon after the one before takes that
// read's last pass as its first: it waits out what is left of the gap, if
// anything, and reads one pass. So back-to-back reads cost one pass each, not
// a gap and two passes, and judge raft progress exactly as strictly:
//
//   - the earlier pass counts only when every control plane answered it, and
//     only when it began at most two gaps before the new pass. A member is
//     judged on what the leader had committed when the earlier pass was
//     read, so the earlier that pass, the longer a stall it would let pass:
//     two gaps bounds that, where a fresh two-pass read bounds it at one gap
//     and its calls' time;
//   - it ended at least a gap before the new pass, as ReadEtcdProgress's
//     passes are apart.
//
// Otherwise the read is a whole ReadEtcdProgress. Reads are one at a time:
// a second caller waits for the first's read to end, then reads its own.
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
	// last is the latest read's second pass when every control plane
	// answered it, nil otherwise; begun and ended when it was read; view the
	// read's view when its member list and alarms were read too.
	last         map[string]talos.EtcdStatus
	view         *EtcdView
	begun, ended time.Time
	now          func() time.Time
	sleep        func(context.Context, time.Duration)
}

// Recent is the last view when every control plane answered its second
// pass, the member list and the alarms were read, and that pass began within
// a gap; else a Read.
func (c *EtcdChain) Recent(ctx context.Context) *EtcdView {
	c.mu.Lock()

	now, _ := c.clock()
	if c.view != nil && now().Sub(c.begun) <= c.gap() {
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

	var v *EtcdView

	if c.chains(now(), gap) {
		if rest := gap - now().Sub(c.ended); rest > 0 {
			wait(ctx, rest)
		}

		begun := now()
		v = readEtcdAfter(ctx, c.Reader, c.ControlPlanes, c.last, nil, begun.Sub(c.ended).Round(10*time.Millisecond))
		c.keep(v, begun, now())

		return v
	}

	before, failed := readEtcdStatuses(ctx, c.Reader, c.ControlPlanes)

	wait(ctx, gap)

	begun := now()
	v = readEtcdAfter(ctx, c.Reader, c.ControlPlanes, before, failed, gap)
	c.keep(v, begun, now())

	return v
}

// chains reports whether the last read's second pass, read at now, can be
// the next read's first (see EtcdChain): every control plane answered it,
// and once the rest of the gap is waited out it began at most two gaps
// before.
func (c *EtcdChain) chains(now time.Time, gap time.Duration) bool {
	if c.last == nil || len(c.last) != len(c.ControlPlanes) {
		return false
	}

	start := now
	if rest := gap - now.Sub(c.ended); rest > 0 {
		start = now.Add(rest)
	}

	return start.Sub(c.begun) <= 2*gap
}

// keep records v's second pass, begun when its calls were made, for the
// next read when every control plane answered it. ended is when the whole
// read ended: the member list and the alarms came after the pass, so the
// next pass's gap is counted from later than it need be, never earlier.
func (c *EtcdChain) keep(v *EtcdView, begun, ended time.Time) {
	if len(v.StatusErr) > 0 || len(v.Status) != len(c.ControlPlanes) {
		c.last, c.view = nil, nil

		return
	}

	c.last, c.view, c.begun, c.ended = v.Status, nil, begun, ended
	if v.ListErr == nil && v.AlarmsErr == nil {
		c.view = v
	}
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
