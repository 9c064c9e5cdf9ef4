package stages

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// movingEtcd is three members on a clock: the leader commits 100 entries a
// second and the followers keep up, except one stalled from stalledAt on.
// It counts the status calls.
type movingEtcd struct {
	mu        sync.Mutex
	t         time.Duration // since the test began
	stalled   string        // an IP whose member stops applying at stalledAt
	stalledAt time.Duration
	down      map[string]bool
	calls     int
}

var chainNodes = []EtcdNode{{"cp-1", "10.0.0.11"}, {"cp-2", "10.0.0.12"}, {"cp-3", "10.0.0.13"}}

func (m *movingEtcd) EtcdStatus(_ context.Context, ip string) (talos.EtcdStatus, error) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.calls++

	if m.down[ip] {
		return talos.EtcdStatus{}, errors.New("connection refused")
	}

	id := map[string]uint64{"10.0.0.11": 1, "10.0.0.12": 2, "10.0.0.13": 3}[ip]

	at := m.t
	if ip == m.stalled && at > m.stalledAt {
		at = m.stalledAt
	}

	index := 9000 + uint64(at/(10*time.Millisecond))

	return talos.EtcdStatus{MemberID: id, Leader: 1, RaftTerm: 3, RaftIndex: index, RaftAppliedIndex: index}, nil
}

func (m *movingEtcd) EtcdMembers(context.Context, string) ([]talos.EtcdMember, error) {
	return []talos.EtcdMember{{ID: 1, Hostname: "cp-1"}, {ID: 2, Hostname: "cp-2"}, {ID: 3, Hostname: "cp-3"}}, nil
}

func (m *movingEtcd) EtcdAlarms(context.Context, string) ([]talos.EtcdAlarm, error) { return nil, nil }

// advance moves the clock on by d.
func (m *movingEtcd) advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()

	m.t += d
}

// read is one chained read (Read): how many status calls it made, how long
// it waited, and its view.
func (m *movingEtcd) read(c *EtcdChain) (int, time.Duration, *EtcdView) {
	return m.measure(func() *EtcdView { return c.Read(context.Background()) })
}

// look is read's Recent.
func (m *movingEtcd) look(c *EtcdChain) (int, time.Duration, *EtcdView) {
	return m.measure(func() *EtcdView { return c.Recent(context.Background()) })
}

func (m *movingEtcd) measure(read func() *EtcdView) (int, time.Duration, *EtcdView) {
	m.mu.Lock()
	calls, t := m.calls, m.t
	m.mu.Unlock()

	v := read()

	m.mu.Lock()
	defer m.mu.Unlock()

	return m.calls - calls, m.t - t, v
}

func chainOver(m *movingEtcd) *EtcdChain {
	epoch := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)

	return &EtcdChain{
		Reader: m, ControlPlanes: chainNodes, Gap: time.Second,
		now: func() time.Time {
			m.mu.Lock()
			defer m.mu.Unlock()

			return epoch.Add(m.t)
		},
		sleep: func(_ context.Context, d time.Duration) { m.advance(d) },
	}
}

// TestEtcdChainReadsOnePassSoonAfter: a read soon after another (a control
// plane's gate before its install, after the look before its cordon and a
// short drain) takes a kept pass as its first and reads one pass: the first
// read's first pass, a gap before its second, serves at once; later, the
// latest pass a gap old; long after, the read is two passes and the whole gap
// again.
func TestEtcdChainReadsOnePassSoonAfter(t *testing.T) {
	m := &movingEtcd{}
	c := chainOver(m)

	calls, waited, first := m.read(c)
	assert.Equal(t, 6, calls, "the first read: two passes")
	assert.Equal(t, time.Second, waited)
	assert.True(t, first.Judge("cp-2").Healthy(), first.Judge("cp-2").Describe())

	m.advance(400 * time.Millisecond) // the drain

	calls, waited, second := m.read(c)
	assert.Equal(t, 3, calls, "soon after: one pass")
	assert.Zero(t, waited, "the first read's first pass ended 1.4s before")
	assert.Equal(t, first.Before, second.Before, "the first read's first pass is the first")
	assert.Equal(t, 1400*time.Millisecond, second.Gap)
	assert.True(t, second.Judge("cp-2").Healthy(), second.Judge("cp-2").Describe())

	m.advance(200 * time.Millisecond) // the install

	calls, waited, third := m.read(c)
	assert.Equal(t, 3, calls, "one pass")
	assert.Zero(t, waited)
	assert.Equal(t, first.Before, third.Before, "the first read's first pass, 1.6s before, still serves")
	assert.Equal(t, 1600*time.Millisecond, third.Gap)

	m.advance(700 * time.Millisecond) // 2.3s after the first pass, which no longer serves

	calls, waited, fourth := m.read(c)
	assert.Equal(t, 3, calls, "within two gaps of a later pass: one pass")
	assert.Zero(t, waited)
	assert.Equal(t, first.Status, fourth.Before, "the latest pass a gap old: the first read's second")
	assert.Equal(t, 1300*time.Millisecond, fourth.Gap)

	m.advance(100 * time.Millisecond)

	calls, waited, fifth := m.read(c)
	assert.Equal(t, 3, calls)
	assert.Zero(t, waited)
	assert.Equal(t, second.Status, fifth.Before, "the latest pass a gap old: the second read's, of 1s before")

	m.advance(2100 * time.Millisecond) // the reboot: more than two gaps

	calls, waited, _ = m.read(c)
	assert.Equal(t, 6, calls, "long after: two passes")
	assert.Equal(t, time.Second, waited)

	m.advance(1900 * time.Millisecond)

	calls, waited, _ = m.read(c)
	assert.Equal(t, 3, calls, "the last read's second pass, 1.9s before")
	assert.Zero(t, waited)

	m.advance(300 * time.Millisecond)

	calls, waited, _ = m.read(c)
	assert.Equal(t, 3, calls, "one pass")
	assert.Equal(t, 700*time.Millisecond, waited, "only the last pass can serve, 300ms old: what is left of the gap")
}

// TestEtcdChainCatchesAStall: a member that stopped applying is judged
// behind by a chained read whose first pass came after the stall, as by a
// two-pass one. It stalled 200ms before the first read's second pass: the
// read right after takes the first read's first pass, from before the stall,
// and the stall passes (a fresh two-pass read lets one as young pass too);
// the next read, a gap after the stall, takes a pass from after it and
// catches it.
func TestEtcdChainCatchesAStall(t *testing.T) {
	m := &movingEtcd{stalled: "10.0.0.12", stalledAt: 800 * time.Millisecond}
	c := chainOver(m)

	_, _, first := m.read(c)
	require.True(t, first.Judge("cp-3").Healthy(), first.Judge("cp-3").Describe())

	m.advance(300 * time.Millisecond)

	calls, waited, second := m.read(c)
	require.Equal(t, 3, calls, "chained")
	require.Zero(t, waited)
	require.True(t, second.Judge("cp-3").Healthy(), "a stall 500ms old, after the read's first pass: %s", second.Judge("cp-3").Describe())

	m.advance(time.Second)

	calls, _, third := m.read(c)
	require.Equal(t, 3, calls, "chained")

	verdict := third.Judge("cp-3")
	assert.False(t, verdict.Healthy())
	assert.Contains(t, verdict.Describe(), "member cp-2 raft index 9080 is 50 behind the leader's 9130 of 1s before: it does not keep up")
}

// TestEtcdChainStartsAfreshAfterAMemberFailed: a pass a member did not
// answer is no first pass for the next read, which reads two again.
func TestEtcdChainStartsAfreshAfterAMemberFailed(t *testing.T) {
	m := &movingEtcd{down: map[string]bool{"10.0.0.13": true}}
	c := chainOver(m)

	calls, _, first := m.read(c)
	assert.Equal(t, 5, calls, "cp-3 is not asked again in the second pass")
	assert.Contains(t, first.Judge("cp-1").Describe(), "member cp-3 does not answer etcd status")

	m.down = nil

	calls, waited, second := m.read(c)
	assert.Equal(t, 6, calls, "two passes")
	assert.Equal(t, time.Second, waited)
	assert.True(t, second.Judge("cp-1").Healthy(), second.Judge("cp-1").Describe())

	calls, _, _ = m.read(c)
	assert.Equal(t, 3, calls, "every member answered the last pass: chained again")
}

// TestEtcdChainRecent: a look within a gap of the last pass is that view,
// with no call; later, or after a read a member did not answer, it reads.
func TestEtcdChainRecent(t *testing.T) {
	m := &movingEtcd{}
	c := chainOver(m)

	_, _, first := m.read(c)

	m.advance(900 * time.Millisecond)

	calls, waited, v := m.look(c)
	assert.Zero(t, calls)
	assert.Zero(t, waited)
	assert.Same(t, first, v)

	m.advance(200 * time.Millisecond)

	calls, _, v = m.look(c)
	assert.Equal(t, 3, calls, "more than a gap since the last pass began: a chained read")
	assert.NotSame(t, first, v)

	m.down = map[string]bool{"10.0.0.13": true}
	_, _, _ = m.read(c)
	m.down = nil

	calls, _, _ = m.look(c)
	assert.Equal(t, 3, calls, "the last read missed a member: no view to give; a read, chained on the pass before it")
}

// TestEtcdChainPassWhileAControlPlaneReboots: passes read while cp-3
// reboots, without it, let the read at its return judge it in one pass, on
// what the leader had committed a gap or more before: a member back in step
// passes at once, one still catching up does not. A pass without the leader
// is not kept.
func TestEtcdChainPassWhileAControlPlaneReboots(t *testing.T) {
	t.Run("back in step", func(t *testing.T) {
		m := &movingEtcd{down: map[string]bool{"10.0.0.13": true}}
		c := chainOver(m)

		c.Pass(context.Background(), "cp-3")
		assert.Equal(t, 2, m.calls, "cp-3 is not asked")

		m.advance(time.Second)
		c.Pass(context.Background(), "cp-3")
		m.advance(300 * time.Millisecond)

		m.down = nil // back

		calls, waited, v := m.read(c)
		assert.Equal(t, 3, calls, "one pass, cp-3 asked")
		assert.Zero(t, waited, "the pass of 1.3s before serves")
		assert.Equal(t, 1300*time.Millisecond, v.Gap)
		assert.NotContains(t, v.Before, "cp-3")

		verdict := v.Judge("")
		assert.True(t, verdict.Healthy(), verdict.Describe())
		assert.Empty(t, verdict.Rejoined("cp-3"))
	})

	t.Run("catching up", func(t *testing.T) {
		m := &movingEtcd{down: map[string]bool{"10.0.0.13": true}, stalled: "10.0.0.13", stalledAt: 0}
		c := chainOver(m)

		m.advance(500 * time.Millisecond)
		c.Pass(context.Background(), "cp-3")
		m.advance(1100 * time.Millisecond)

		m.down = nil // back, its raft where it stopped

		calls, waited, v := m.read(c)
		assert.Equal(t, 3, calls)
		assert.Zero(t, waited)
		assert.Equal(t, "member cp-3 raft index 9000 is 50 behind the leader's 9050 of 1.1s before: it does not keep up",
			v.Judge("").Rejoined("cp-3"))
	})

	t.Run("a pass every gap", func(t *testing.T) {
		m := &movingEtcd{down: map[string]bool{"10.0.0.13": true}}
		c := chainOver(m)

		ctx, cancel := context.WithCancel(context.Background())
		c.sleep = func(_ context.Context, d time.Duration) {
			m.advance(d)

			if m.calls >= 6 { // three passes of two calls
				cancel()
			}
		}

		c.PassEvery(ctx, "cp-3")
		assert.Equal(t, 6, m.calls, "cp-3 is not asked")
		assert.Equal(t, 3*time.Second, m.t, "a pass a gap after the one before")

		m.down = nil

		calls, waited, _ := m.read(c)
		assert.Equal(t, 3, calls, "the read at the return: one pass")
		assert.Zero(t, waited)
	})

	t.Run("the leader down", func(t *testing.T) {
		m := &movingEtcd{down: map[string]bool{"10.0.0.11": true}}
		c := chainOver(m)

		c.Pass(context.Background(), "cp-1")
		m.advance(1200 * time.Millisecond)

		m.down = nil

		calls, waited, _ := m.read(c)
		assert.Equal(t, 6, calls, "the pass without the leader was not kept: two passes")
		assert.Equal(t, time.Second, waited)
	})
}

// TestEtcdChainSeededByAnother: a pass one chain read (a runner handing over)
// serves another chain's first read (its successor's) as its own would: one
// pass, after what is left of the gap. A pass too old, one from the future (a
// clock ahead), one without every control plane or without the leader, is not
// kept, and the read is two passes. A member stalled before the handed pass is
// caught.
func TestEtcdChainSeededByAnother(t *testing.T) {
	m := &movingEtcd{}
	before := chainOver(m)

	before.Pass(context.Background(), "")
	passes := before.Passes()
	require.Len(t, passes, 1)
	handed := passes[0]
	assert.Len(t, handed.Status, 3)

	m.advance(600 * time.Millisecond) // the successor starts

	after := chainOver(m)
	require.Equal(t, 1, after.Seed(handed))

	calls, waited, v := m.read(after)
	assert.Equal(t, 3, calls, "one pass")
	assert.Equal(t, 400*time.Millisecond, waited, "what is left of the gap after the handed pass")
	assert.Equal(t, handed.Status, v.Before)
	assert.True(t, v.Judge("cp-2").Healthy(), v.Judge("cp-2").Describe())

	without := func(name string) EtcdPass {
		p := EtcdPass{Status: map[string]talos.EtcdStatus{}, Begun: handed.Begun, Ended: handed.Ended}
		for k, s := range handed.Status {
			if k != name {
				p.Status[k] = s
			}
		}

		return p
	}
	shifted := func(d time.Duration) EtcdPass {
		return EtcdPass{Status: handed.Status, Begun: handed.Begun.Add(d), Ended: handed.Ended.Add(d)}
	}

	refused := map[string]EtcdPass{
		"too old":            shifted(-1500 * time.Millisecond),
		"from the future":    shifted(time.Second),
		"a member missing":   without("cp-3"),
		"the leader missing": without("cp-1"),
		"never read":         {},
	}
	for name, p := range refused {
		t.Run(name, func(t *testing.T) {
			m := &movingEtcd{t: 600 * time.Millisecond}
			c := chainOver(m)
			assert.Zero(t, c.Seed(p))

			calls, waited, _ := m.read(c)
			assert.Equal(t, 6, calls, "two passes")
			assert.Equal(t, time.Second, waited)
		})
	}

	t.Run("a read's two passes", func(t *testing.T) {
		m := &movingEtcd{}
		plan := chainOver(m)
		plan.Read(context.Background())

		passes := plan.Passes()
		require.Len(t, passes, 2, "both passes of a two-pass read")

		m.advance(700 * time.Millisecond) // the launch and the runner's start

		runner := chainOver(m)
		require.Equal(t, 2, runner.Seed(passes...))

		calls, waited, v := m.read(runner)
		assert.Equal(t, 3, calls, "one pass")
		assert.Zero(t, waited, "the first pass, 1.7s old, serves at once")
		assert.Equal(t, passes[0].Status, v.Before)
	})

	t.Run("a stall before the handed pass", func(t *testing.T) {
		m := &movingEtcd{stalled: "10.0.0.12", stalledAt: 0, t: 500 * time.Millisecond}
		before := chainOver(m)
		before.Pass(context.Background(), "")

		m.advance(time.Second)

		after := chainOver(m)
		require.Equal(t, 1, after.Seed(before.Passes()...))

		_, _, v := m.read(after)
		assert.False(t, v.Judge("cp-1").Healthy(), "cp-2 does not keep up")
	})
}
