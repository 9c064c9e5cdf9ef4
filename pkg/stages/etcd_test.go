package stages

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// etcdOf builds a view of n control planes cp-1..cp-n, members 1..n, cp-1
// leading, every status clean at raft index 9000; change applies the case.
func etcdOf(n int, change func(v *EtcdView)) *EtcdView {
	v := &EtcdView{Status: map[string]talos.EtcdStatus{}, StatusErr: map[string]error{}, ListedBy: "cp-1"}

	for i := 1; i <= n; i++ {
		name := "cp-" + string(rune('0'+i))
		v.ControlPlanes = append(v.ControlPlanes, EtcdNode{Name: name, IP: "10.0.0.1" + string(rune('0'+i))})
		v.Members = append(v.Members, talos.EtcdMember{ID: uint64(i), Hostname: name, PeerURLs: []string{"https://10.0.0.1" + string(rune('0'+i)) + ":2380"}})
		v.Status[name] = talos.EtcdStatus{MemberID: uint64(i), Leader: 1, RaftIndex: 9000, RaftTerm: 3}
	}

	if change != nil {
		change(v)
	}

	return v
}

func TestEtcdJudge(t *testing.T) {
	stopped := func(v *EtcdView) {
		delete(v.Status, "cp-3")
		v.StatusErr["cp-3"] = errors.New(`node "10.0.0.13": etcd status: rpc error: code = DeadlineExceeded desc = context deadline exceeded`)
	}

	for _, tc := range []struct {
		name    string
		view    *EtcdView
		node    string
		healthy bool
		outage  bool
		voters  int
		left    int
		// problem is in Describe(); look is in LookAction.
		problem, look string
	}{
		{name: "3 healthy: quorum kept without cp-1", view: etcdOf(3, nil), node: "cp-1", healthy: true, voters: 3, left: 2},
		{name: "5 healthy", view: etcdOf(5, nil), node: "cp-2", healthy: true, voters: 5, left: 4},
		{name: "1 member: an outage", view: etcdOf(1, nil), node: "cp-1", healthy: true, outage: true, voters: 1, left: 0},
		{name: "2 members: an outage", view: etcdOf(2, nil), node: "cp-2", healthy: true, outage: true, voters: 2, left: 1},
		{name: "no node judged: only health", view: etcdOf(2, nil), healthy: true, voters: 2, left: 2},
		{
			name: "stopped but listed", view: etcdOf(3, stopped), node: "cp-1", voters: 3, left: 1, outage: true,
			problem: "member cp-3 does not answer etcd status: node \"10.0.0.13\": etcd status: rpc error: code = DeadlineExceeded",
			look:    "talosctl -n 10.0.0.13 etcd status",
		},
		{
			name: "stopped member of 5 still pauses", view: etcdOf(5, stopped), node: "cp-1", voters: 5, left: 3,
			problem: "member cp-3 does not answer etcd status",
		},
		{
			name: "NOSPACE alarm", node: "cp-1", voters: 3, left: 1, outage: true,
			view: etcdOf(3, func(v *EtcdView) {
				v.Alarms = []talos.EtcdAlarm{{MemberID: 3, Alarm: "NOSPACE"}}
				for name, s := range v.Status {
					s.Errors = []string{"memberID:3 alarm:NOSPACE "}
					v.Status[name] = s
				}
			}),
			problem: "member cp-3 alarm NOSPACE",
			look:    "talosctl -n 10.0.0.13 etcd status",
		},
		{
			name: "a learner", node: "cp-1", voters: 2, left: 1, outage: true,
			view:    etcdOf(3, func(v *EtcdView) { v.Members[2].IsLearner = true }),
			problem: "member cp-3 a learner (not yet promoted to voter)",
		},
		{
			name: "raft index far behind", node: "cp-1", voters: 3, left: 1, outage: true,
			view: etcdOf(3, func(v *EtcdView) {
				s := v.Status["cp-2"]
				s.RaftIndex = 9000 - EtcdMaxRaftLag - 1
				v.Status["cp-2"] = s
			}),
			problem: "member cp-2 raft index 7999 is 1001 behind the leader's 9000",
		},
		{
			name: "raft index a little behind", node: "cp-1", healthy: true, voters: 3, left: 2,
			view: etcdOf(3, func(v *EtcdView) {
				s := v.Status["cp-2"]
				s.RaftIndex = 9000 - EtcdMaxRaftLag
				v.Status["cp-2"] = s
			}),
		},
		{
			name: "no leader", node: "cp-1", voters: 3, left: 1, outage: true,
			view: etcdOf(3, func(v *EtcdView) {
				s := v.Status["cp-2"]
				s.Leader, s.Errors = 0, []string{"etcdserver: no leader"}
				v.Status["cp-2"] = s
			}),
			problem: "member cp-2 reports etcdserver: no leader",
		},
		{
			name: "never started", node: "cp-1", voters: 4, left: 2, outage: true,
			view: etcdOf(3, func(v *EtcdView) {
				v.Members = append(v.Members, talos.EtcdMember{ID: 0xab, PeerURLs: []string{"https://10.0.0.99:2380"}})
			}),
			problem: "member 00000000000000ab listed but never started",
			look:    "talosctl -n 10.0.0.99 etcd status",
		},
		{
			name: "stale member of a removed node", node: "cp-1", voters: 4, left: 2, outage: true,
			view: etcdOf(3, func(v *EtcdView) {
				v.Members = append(v.Members, talos.EtcdMember{ID: 9, Hostname: "cp-old", PeerURLs: []string{"https://10.0.0.9:2380"}})
			}),
			problem: "member cp-old no control-plane Node runs it",
		},
		{
			name: "a control plane without a member", node: "cp-1", voters: 2, left: 1, outage: true,
			view:    etcdOf(3, func(v *EtcdView) { v.Members = v.Members[:2] }),
			problem: "control plane cp-3 has no etcd member",
		},
		{
			name: "no member list", node: "cp-1", voters: 0, left: 0, outage: true,
			view: etcdOf(3, func(v *EtcdView) {
				v.Members, v.ListErr = nil, errors.New("no control plane's etcd member answered its status with a leader (3 control plane(s))")
			}),
			problem: "etcd member list: no control plane's etcd member answered",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.view.Judge(tc.node)

			assert.Equal(t, tc.healthy, v.Healthy(), "healthy: %s", v.Describe())
			assert.Equal(t, tc.outage, v.Outage(), "outage: %d left of quorum %d", v.Left, v.Quorum)
			assert.Equal(t, tc.voters, v.Voters, "voters")
			assert.Equal(t, tc.left, v.Left, "left")

			if tc.healthy {
				assert.Empty(t, v.Describe())
			} else {
				assert.Contains(t, v.Describe(), tc.problem)
				assert.Contains(t, v.LookAction("resume"), tc.look)
			}
		})
	}
}

// TestEtcdJudgeProgress: a view read in two passes a second apart judges
// raft lag by progress: every member's second reading must have applied
// what the most advanced member had committed at the first. Members read
// at different moments under load (3000 entries apart in one pass: past
// EtcdMaxRaftLag) keep up; a stalled member, or one that commits but does
// not apply, does not.
func TestEtcdJudgeProgress(t *testing.T) {
	twoPass := func(before, after map[string][2]uint64) *EtcdView {
		return etcdOf(3, func(v *EtcdView) {
			v.Gap, v.Before = time.Second, map[string]talos.EtcdStatus{}

			for name, s := range v.Status {
				b, a := s, s
				b.RaftIndex, b.RaftAppliedIndex = before[name][0], before[name][1]
				a.RaftIndex, a.RaftAppliedIndex = after[name][0], after[name][1]
				v.Before[name], v.Status[name] = b, a
			}
		})
	}

	for _, tc := range []struct {
		name          string
		before, after map[string][2]uint64
		problem       string
	}{
		{
			name:   "under load, cp-3 read 300ms later in each pass",
			before: map[string][2]uint64{"cp-1": {9000, 9000}, "cp-2": {9000, 8998}, "cp-3": {12000, 12000}},
			after:  map[string][2]uint64{"cp-1": {22000, 22000}, "cp-2": {22000, 21999}, "cp-3": {25000, 25000}},
		},
		{
			name:   "idle: nothing written, nothing moves",
			before: map[string][2]uint64{"cp-1": {9000, 9000}, "cp-2": {9000, 9000}, "cp-3": {9000, 9000}},
			after:  map[string][2]uint64{"cp-1": {9000, 9000}, "cp-2": {9000, 9000}, "cp-3": {9000, 9000}},
		},
		{
			name:    "stalled",
			before:  map[string][2]uint64{"cp-1": {9000, 9000}, "cp-2": {8990, 8990}, "cp-3": {9000, 9000}},
			after:   map[string][2]uint64{"cp-1": {9500, 9500}, "cp-2": {8990, 8990}, "cp-3": {9500, 9500}},
			problem: "member cp-2 raft index 8990 is 10 behind the leader's 9000 of 1s before: it does not keep up",
		},
		{
			name:    "commits but does not apply",
			before:  map[string][2]uint64{"cp-1": {9000, 9000}, "cp-2": {9000, 7000}, "cp-3": {9000, 9000}},
			after:   map[string][2]uint64{"cp-1": {9500, 9500}, "cp-2": {9500, 7100}, "cp-3": {9500, 9500}},
			problem: "member cp-2 raft index 7100 is 1900 behind the leader's 9000 of 1s before",
		},
		{
			name:    "catching up, more than the gap behind",
			before:  map[string][2]uint64{"cp-1": {90000, 90000}, "cp-2": {40000, 40000}, "cp-3": {90000, 90000}},
			after:   map[string][2]uint64{"cp-1": {91000, 91000}, "cp-2": {60000, 60000}, "cp-3": {91000, 91000}},
			problem: "member cp-2 raft index 60000 is 30000 behind the leader's 90000",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := twoPass(tc.before, tc.after).Judge("cp-1")
			if tc.problem == "" {
				assert.True(t, v.Healthy(), v.Describe())

				return
			}

			assert.False(t, v.Healthy())
			assert.Contains(t, v.Describe(), tc.problem)
		})
	}

	// The same readings judged in one pass: the healthy members under load
	// fall foul of the fixed threshold.
	one := etcdOf(3, func(v *EtcdView) {
		for name, idx := range map[string]uint64{"cp-1": 9000, "cp-2": 9000, "cp-3": 12000} {
			s := v.Status[name]
			s.RaftIndex = idx
			v.Status[name] = s
		}
	})
	assert.Contains(t, one.Judge("cp-1").Describe(), "member cp-1 raft index 9000 is 3000 behind the leader's 12000")
}

// etcdByIP is an EtcdReader over a view: what each control plane's Talos
// answers, by IP.
type etcdByIP struct {
	status map[string]talos.EtcdStatus
	err    map[string]error
	list   []talos.EtcdMember
	asked  []string
}

func (e *etcdByIP) EtcdStatus(_ context.Context, ip string) (talos.EtcdStatus, error) {
	if err := e.err[ip]; err != nil {
		return talos.EtcdStatus{}, err
	}

	return e.status[ip], nil
}

func (e *etcdByIP) EtcdMembers(_ context.Context, ip string) ([]talos.EtcdMember, error) {
	e.asked = append(e.asked, ip)

	return e.list, nil
}

func (e *etcdByIP) EtcdAlarms(context.Context, string) ([]talos.EtcdAlarm, error) { return nil, nil }

func TestReadEtcdAsksTheLeaderForTheList(t *testing.T) {
	r := &etcdByIP{
		status: map[string]talos.EtcdStatus{
			"10.0.0.11": {MemberID: 1, Leader: 2, RaftIndex: 10},
			"10.0.0.12": {MemberID: 2, Leader: 2, RaftIndex: 10},
		},
		err:  map[string]error{"10.0.0.13": errors.New("deadline exceeded")},
		list: []talos.EtcdMember{{ID: 1, Hostname: "cp-1"}, {ID: 2, Hostname: "cp-2"}, {ID: 3, Hostname: "cp-3"}},
	}

	v := ReadEtcd(context.Background(), r, []EtcdNode{{"cp-1", "10.0.0.11"}, {"cp-2", "10.0.0.12"}, {"cp-3", "10.0.0.13"}})
	require.NoError(t, v.ListErr)
	assert.Equal(t, "cp-2", v.ListedBy)
	assert.Equal(t, []string{"10.0.0.12"}, r.asked)

	verdict := v.Judge("cp-1")
	assert.Equal(t, "member cp-3 does not answer etcd status: deadline exceeded", verdict.Describe())
}

// TestEtcdRejoined: after its reboot a control plane counts as back once its
// own member is healthy and etcd has quorum, even while another member is
// down (a reboot a resumed run has yet to follow).
func TestEtcdRejoined(t *testing.T) {
	down := func(node string) func(v *EtcdView) {
		return func(v *EtcdView) {
			delete(v.Status, node)
			v.StatusErr[node] = errors.New("connection refused")
		}
	}

	assert.Empty(t, etcdOf(3, nil).Judge("").Rejoined("cp-1"))
	assert.Empty(t, etcdOf(3, down("cp-2")).Judge("").Rejoined("cp-1"), "cp-2 down: quorum kept")
	assert.Equal(t, "member cp-1 does not answer etcd status: connection refused", etcdOf(3, down("cp-1")).Judge("").Rejoined("cp-1"))
	assert.Contains(t, etcdOf(3, func(v *EtcdView) { down("cp-2")(v); down("cp-3")(v) }).Judge("").Rejoined("cp-1"),
		"1 of 3 voter(s) healthy, short of the quorum of 2")
	assert.Equal(t, "member cp-1 a learner (not yet promoted to voter)",
		etcdOf(3, func(v *EtcdView) { v.Members[0].IsLearner = true }).Judge("").Rejoined("cp-1"))
	assert.Equal(t, "no member of cp-1 listed", etcdOf(3, func(v *EtcdView) { v.Members = v.Members[1:] }).Judge("").Rejoined("cp-1"))
}
