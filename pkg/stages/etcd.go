package stages

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// Rebooting a control plane stops its etcd member. Talos' own upgrade path
// (LifecycleService.Upgrade, then Reboot) checks nothing of etcd first, so
// ichor does, before it cordons a control plane and again right before its
// install and its reboot: every member answers its status through Talos
// (reachable, no error, no alarm such as NOSPACE, not a learner, its raft
// log keeping up with the leader's), every control plane has a member, and
// the voters left while this one is down still make a quorum.
// A one- or two-member etcd cannot keep quorum through any reboot: it is
// refused unless the operator accepts the outage (--allow-etcd-outage).

// EtcdReader reads etcd through the control planes' Talos APIs, each call
// addressed to one node. *talos.Client satisfies it.
type EtcdReader interface {
	// EtcdMembers lists the members as the node's own etcd reports them
	// (MachineService.EtcdMemberList).
	EtcdMembers(ctx context.Context, node string) ([]talos.EtcdMember, error)
	// EtcdStatus is the node's own member's status (MachineService.EtcdStatus).
	EtcdStatus(ctx context.Context, node string) (talos.EtcdStatus, error)
	// EtcdAlarms lists the cluster's active alarms
	// (MachineService.EtcdAlarmList).
	EtcdAlarms(ctx context.Context, node string) ([]talos.EtcdAlarm, error)
}

// Raft lag. A member's status gives its committed index (raftIndex) and
// what it has applied of it (raftAppliedIndex), read through apid at the
// moment its call reaches it; the members are read concurrently, but one
// answers later than another (Talos dials a new etcd client for every
// status call, on a node that may be busy). Under write load the indexes
// move by the write rate, so two healthy members read a second apart
// differ by a second of writes: a fixed threshold on indexes read at
// different moments trips on a busy cluster. Measured on the local cluster
// (e2e TestEtcdRaftLagUnderLoad: one real etcd behind the simulated
// members, each status read at the moment it is answered; 450 to 1100
// writes a second, through the API server and straight to etcd): with every
// member in step and cp-3's status answering 2 s late (a loaded node), the
// committed indexes of one pass spread 700 to 1540 entries, and a threshold
// of 1000 refused 4 healthy reads of 5; read in two passes as below, none.
//
// So etcd is read twice, EtcdProgressGap apart (ReadEtcdProgress), and a
// member keeps up when its second reading has applied at least what the
// most advanced member had committed at the first: a healthy follower
// trails the leader by milliseconds, whatever the write rate, and passes;
// a member whose raft stalled (a full disk, a wedged apply loop) stays
// behind as soon as anything was written since it stalled, and one catching
// up after a restart fails while it is more than the gap behind.
const EtcdProgressGap = time.Second

// EtcdMaxRaftLag is how far, in raft entries, a member's committed index may
// trail the most advanced one read in the same pass and still count as in
// step, for a view read in one pass only (no EtcdView.Before).
const EtcdMaxRaftLag = 1000

// etcdCallTimeout bounds each etcd call through Talos: a member whose etcd
// is stopped makes Talos wait until the caller gives up.
const etcdCallTimeout = 5 * time.Second

// EtcdNode is a control-plane Node: its name and the address its Talos API
// is reached at.
type EtcdNode struct {
	Name string
	IP   string
}

// EtcdView is etcd as the control planes' Talos APIs described it, read at
// one moment by ReadEtcd.
type EtcdView struct {
	// ControlPlanes are the control-plane Nodes, held ones included (their
	// members count for quorum all the same).
	ControlPlanes []EtcdNode
	// Status is each control plane's own member status, by Node name;
	// StatusErr why a control plane's did not come.
	Status    map[string]talos.EtcdStatus
	StatusErr map[string]error
	// Before are the statuses of the first of two passes, Gap before Status
	// (empty for a view read in one pass): what the members must have
	// caught up with by the second.
	Before map[string]talos.EtcdStatus
	Gap    time.Duration
	// Members is the member list, as ListedBy's etcd reports it; ListErr
	// why no control plane could list them.
	Members  []talos.EtcdMember
	ListedBy string
	ListErr  error
	// Alarms are the active alarms; AlarmsErr why they could not be read.
	Alarms    []talos.EtcdAlarm
	AlarmsErr error
}

// ReadEtcd is ReadEtcdProgress with EtcdProgressGap between its passes.
func ReadEtcd(ctx context.Context, r EtcdReader, controlPlanes []EtcdNode) *EtcdView {
	return ReadEtcdProgress(ctx, r, controlPlanes, EtcdProgressGap)
}

// ReadEtcdProgress reads every control plane's member status at once,
// twice, gap apart (Before, then Status: what the raft lag is judged on; a
// member that did not answer the first pass is not asked again, its error
// stands), then the member list and the alarms from a control plane whose
// member answered without errors. Each call is bounded; nothing here
// fails: what could not be read is in the view, for Judge.
func ReadEtcdProgress(ctx context.Context, r EtcdReader, controlPlanes []EtcdNode, gap time.Duration) *EtcdView {
	before, failed := readEtcdStatuses(ctx, r, controlPlanes)

	select {
	case <-ctx.Done():
	case <-time.After(gap):
	}

	return readEtcdAfter(ctx, r, controlPlanes, before, failed, gap)
}

// readEtcdAfter is the second half of a read: the statuses again of the
// control planes but those that failed the first pass (before; failed says
// why they did not answer, and stands), gap after it, then the member list
// and the alarms. A control plane the first pass did not ask (a chained
// read's first pass taken while it rebooted, see EtcdChain.Pass) is asked,
// and judged against the leader's committed index of that pass.
func readEtcdAfter(ctx context.Context, r EtcdReader, controlPlanes []EtcdNode,
	before map[string]talos.EtcdStatus, failed map[string]error, gap time.Duration,
) *EtcdView {
	v := &EtcdView{ControlPlanes: controlPlanes, Gap: gap, Before: before}

	asked := make([]EtcdNode, 0, len(controlPlanes))

	for _, n := range controlPlanes {
		if _, ok := failed[n.Name]; !ok {
			asked = append(asked, n)
		}
	}

	v.Status, v.StatusErr = readEtcdStatuses(ctx, r, asked)
	maps.Copy(v.StatusErr, failed)

	// Ask a member that answered and follows a leader, the leader first
	// (an alarm shows among every member's errors: it is no reason to skip).
	var askers []EtcdNode

	for _, n := range controlPlanes {
		if s, ok := v.Status[n.Name]; ok && s.Leader != 0 {
			if s.Leader != 0 && s.Leader == s.MemberID {
				askers = append([]EtcdNode{n}, askers...)
			} else {
				askers = append(askers, n)
			}
		}
	}

	if len(askers) == 0 {
		v.ListErr = fmt.Errorf("no control plane's etcd member answered its status with a leader (%d control plane(s))", len(controlPlanes))
		v.AlarmsErr = v.ListErr

		return v
	}

	for _, n := range askers {
		callCtx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
		members, err := r.EtcdMembers(callCtx, n.IP)

		cancel()

		if err != nil {
			v.ListErr = err

			continue
		}

		v.Members, v.ListedBy, v.ListErr = members, n.Name, nil

		callCtx, cancel = context.WithTimeout(ctx, etcdCallTimeout)
		v.Alarms, v.AlarmsErr = r.EtcdAlarms(callCtx, n.IP)

		cancel()

		break
	}

	return v
}

// readEtcdStatuses reads every control plane's own member status at once,
// each call bounded: by Node name, the statuses and why the others did not
// come.
func readEtcdStatuses(ctx context.Context, r EtcdReader, controlPlanes []EtcdNode) (map[string]talos.EtcdStatus, map[string]error) {
	statuses, errs := map[string]talos.EtcdStatus{}, map[string]error{}

	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)

	for _, n := range controlPlanes {
		wg.Go(func() {
			var (
				s   talos.EtcdStatus
				err error
			)

			if n.IP == "" {
				err = fmt.Errorf("node %q has no InternalIP to reach its Talos API", n.Name)
			} else {
				callCtx, cancel := context.WithTimeout(ctx, etcdCallTimeout)
				s, err = r.EtcdStatus(callCtx, n.IP)

				cancel()
			}

			mu.Lock()
			defer mu.Unlock()

			if err != nil {
				errs[n.Name] = err
			} else {
				statuses[n.Name] = s
			}
		})
	}

	wg.Wait()

	return statuses, errs
}

// EtcdMemberHealth is one member's health, as Judge found it.
type EtcdMemberHealth struct {
	// Name is the member's name (its node's hostname), or its ID in hex when
	// it has none (a member added but never started).
	Name string
	// Node is the control-plane Node the member runs on, "" when none.
	Node string
	// IP is where to look at it with talosctl -n: its Node's InternalIP,
	// else its peer URL's host.
	IP string
	// Voter is false for a learner.
	Voter bool
	// Problem says what is wrong, "" for a healthy member.
	Problem string
}

// EtcdVerdict is what Judge found.
type EtcdVerdict struct {
	// Members are the members, in the order listed.
	Members []EtcdMemberHealth
	// Problems are those that belong to no member: the list or the alarms
	// could not be read, a control plane has no member.
	Problems []string
	// Voters is how many members vote; Quorum how many of them etcd needs.
	Voters, Quorum int
	// Left is how many healthy voters remain while the node judged for is
	// down (every healthy voter when it was judged for no node).
	Left int
}

// Unhealthy returns the members with a problem.
func (v EtcdVerdict) Unhealthy() []EtcdMemberHealth {
	var out []EtcdMemberHealth

	for _, m := range v.Members {
		if m.Problem != "" {
			out = append(out, m)
		}
	}

	return out
}

// UnhealthyOther is the verdict's problems without node's own member: what
// keeps etcd from taking node's reboot, its member down (Describe and
// LookAction say them).
func (v EtcdVerdict) UnhealthyOther(node string) EtcdVerdict {
	out := EtcdVerdict{Problems: v.Problems, Voters: v.Voters, Quorum: v.Quorum, Left: v.Left}

	for _, m := range v.Unhealthy() {
		if m.Node != node || node == "" {
			out.Members = append(out.Members, m)
		}
	}

	return out
}

// Healthy reports that every member is healthy and nothing else is wrong.
func (v EtcdVerdict) Healthy() bool {
	return len(v.Problems) == 0 && len(v.Unhealthy()) == 0
}

// Rejoined says what keeps control plane node's member from counting as
// back after its reboot, "" when nothing does: its member listed, a voter,
// healthy, and etcd with a quorum of healthy voters. Other members need not
// all be healthy: one may be rebooting in an upgrade a resumed run has yet
// to follow; the gate before the next control plane's cordon wants them all.
func (v EtcdVerdict) Rejoined(node string) string {
	var own *EtcdMemberHealth

	for i := range v.Members {
		if v.Members[i].Node == node {
			own = &v.Members[i]
		}
	}

	switch {
	case len(v.Members) == 0 && len(v.Problems) > 0:
		return strings.Join(v.Problems, "; ")
	case own == nil:
		return fmt.Sprintf("no member of %s listed", node)
	case own.Problem != "":
		return fmt.Sprintf("member %s %s", own.Name, own.Problem)
	case v.Left < v.Quorum:
		return fmt.Sprintf("%d of %d voter(s) healthy, short of the quorum of %d: %s", v.Left, v.Voters, v.Quorum, v.Describe())
	}

	return ""
}

// Outage reports that the judged node's reboot leaves fewer healthy voters
// than etcd's quorum: etcd, and with it the Kubernetes API, stops until the
// node is back.
func (v EtcdVerdict) Outage() bool { return v.Left < v.Quorum }

// Judge says how healthy etcd is and what a reboot of control plane node
// (none when "") would leave of it.
func (v *EtcdView) Judge(node string) EtcdVerdict {
	var out EtcdVerdict

	if v.ListErr != nil {
		out.Problems = append(out.Problems, "etcd member list: "+FirstLine(v.ListErr))
	}

	if v.AlarmsErr != nil && v.ListErr == nil {
		out.Problems = append(out.Problems, "etcd alarm list: "+FirstLine(v.AlarmsErr))
	}

	// Each control plane's member: by the ID its status gave, else by name.
	byID := map[uint64]EtcdNode{}
	byName := map[string]EtcdNode{}

	for _, n := range v.ControlPlanes {
		byName[n.Name] = n

		if s, ok := v.Status[n.Name]; ok {
			byID[s.MemberID] = n
		}
	}

	// The raft index every member must have reached: the most advanced
	// committed index of the first pass (of this pass for a one-pass view).
	var lead uint64

	reference := v.Before
	if len(reference) == 0 {
		reference = v.Status
	}

	for _, s := range reference {
		lead = max(lead, s.RaftIndex)
	}

	matched := map[string]bool{}

	for _, m := range v.Members {
		n, ok := byID[m.ID]
		if !ok && m.Hostname != "" {
			n, ok = byName[m.Hostname]
		}

		h := EtcdMemberHealth{Name: m.Hostname, Voter: !m.IsLearner}
		if h.Name == "" {
			h.Name = fmt.Sprintf("%016x", m.ID)
		}

		if ok {
			h.Node, h.IP = n.Name, n.IP
			matched[n.Name] = true
		} else {
			h.IP = peerHost(m.PeerURLs)
		}

		h.Problem = v.memberProblem(m, n, ok, lead)
		out.Members = append(out.Members, h)
	}

	if v.ListErr == nil {
		for _, n := range v.ControlPlanes {
			if !matched[n.Name] {
				problem := fmt.Sprintf("control plane %s has no etcd member", n.Name)
				if err, failed := v.StatusErr[n.Name]; failed {
					problem += " (its etcd status: " + FirstLine(err) + ")"
				}

				out.Problems = append(out.Problems, problem)
			}
		}
	}

	for _, m := range out.Members {
		if !m.Voter {
			continue
		}

		out.Voters++

		if m.Problem == "" && (node == "" || m.Node != node) {
			out.Left++
		}
	}

	out.Quorum = out.Voters/2 + 1

	return out
}

// memberProblem says what is wrong with member m, whose Node is n (ok
// false: none), given the most advanced raft index read; "" when nothing is.
func (v *EtcdView) memberProblem(m talos.EtcdMember, n EtcdNode, ok bool, lead uint64) string {
	var problems []string

	if m.Hostname == "" {
		problems = append(problems, "listed but never started")
	}

	if m.IsLearner {
		problems = append(problems, "a learner (not yet promoted to voter)")
	}

	for _, a := range v.Alarms {
		if a.MemberID == m.ID {
			problems = append(problems, "alarm "+a.Alarm)
		}
	}

	switch s, answered := v.Status[n.Name]; {
	case !ok:
		if m.Hostname != "" {
			problems = append(problems, "no control-plane Node runs it (a stale member still counts for quorum)")
		}
	case !answered:
		problems = append(problems, "does not answer etcd status: "+FirstLine(v.StatusErr[n.Name]))
	default:
		// etcd lists every active alarm of the cluster among each member's
		// errors; the alarm list names the member that raised it.
		var errs []string

		for _, e := range s.Errors {
			if v.AlarmsErr == nil && strings.HasPrefix(e, "memberID:") && strings.Contains(e, "alarm:") {
				continue
			}

			errs = append(errs, strings.TrimSpace(e))
		}

		if len(errs) > 0 {
			problems = append(problems, "reports "+strings.Join(errs, "; "))
		}

		if s.Leader == 0 && len(s.Errors) == 0 {
			problems = append(problems, "has no leader")
		}

		if s.IsLearner && !m.IsLearner {
			problems = append(problems, "a learner (not yet promoted to voter)")
		}

		if problem := v.raftLag(s, lead); problem != "" {
			problems = append(problems, problem)
		}
	}

	return strings.Join(slices.Compact(problems), ", ")
}

// raftLag says how member status s fails to keep up with lead (see
// EtcdProgressGap), "" when it keeps up. A two-pass view wants its applied
// index (its committed one when it reports none) at lead, the leader's
// committed index Gap before; a one-pass view its committed index within
// EtcdMaxRaftLag of the most advanced one.
func (v *EtcdView) raftLag(s talos.EtcdStatus, lead uint64) string {
	if len(v.Before) == 0 {
		if lead > s.RaftIndex && lead-s.RaftIndex > EtcdMaxRaftLag {
			return fmt.Sprintf("raft index %d is %d behind the leader's %d", s.RaftIndex, lead-s.RaftIndex, lead)
		}

		return ""
	}

	index := s.RaftAppliedIndex
	if index == 0 || index > s.RaftIndex {
		index = s.RaftIndex
	}

	if index >= lead {
		return ""
	}

	return fmt.Sprintf("raft index %d is %d behind the leader's %d of %s before: it does not keep up", index, lead-index, lead, v.Gap)
}

// peerHost is the host of the first peer URL, "" when none parses.
func peerHost(urls []string) string {
	for _, u := range urls {
		p, err := url.Parse(u)
		if err != nil || p.Host == "" {
			continue
		}

		if host, _, err := net.SplitHostPort(p.Host); err == nil {
			return host
		}

		return p.Host
	}

	return ""
}

// Describe says in one line what is wrong: every unhealthy member with its
// problem, then the other problems; "" when nothing is.
func (v EtcdVerdict) Describe() string {
	var parts []string

	for _, m := range v.Unhealthy() {
		parts = append(parts, fmt.Sprintf("member %s %s", m.Name, m.Problem))
	}

	parts = append(parts, v.Problems...)

	return strings.Join(parts, "; ")
}

// LookAction says how to look at the unhealthy members with talosctl, then
// to go on with next.
func (v EtcdVerdict) LookAction(next string) string {
	var looks []string

	for _, m := range v.Unhealthy() {
		if m.IP != "" {
			looks = append(looks, fmt.Sprintf("talosctl -n %s etcd status; talosctl -n %s service etcd", m.IP, m.IP))
		}
	}

	if len(looks) == 0 {
		return "look at etcd (talosctl -n <control plane> etcd members; talosctl -n <control plane> etcd status; " +
			"talosctl -n <control plane> etcd alarm list), make every member healthy, then " + next
	}

	return "look at it (" + strings.Join(looks, "; ") + "; an alarm: talosctl -n <node> etcd alarm list), " +
		"make every member healthy, then " + next
}

// OutageText says what the node's reboot does to a small etcd.
func (v EtcdVerdict) OutageText(node string) string {
	return fmt.Sprintf("etcd has %d voting member(s), quorum %d: rebooting %s leaves %d, so etcd and the Kubernetes API stop until it is back",
		v.Voters, v.Quorum, node, v.Left)
}

// OutageAction says how to go on with a small etcd.
const OutageAction = "run 3 or more control planes to keep quorum through each reboot, or accept the outage: " +
	"launch the upgrade again with --allow-etcd-outage (kubectl ichor abort, then kubectl ichor upgrade talos ... --allow-etcd-outage)"

// FirstLine keeps the first of joined errors, and how many more there were: how an
// error is said in a verdict, a node line or a pause reason.
func FirstLine(err error) string {
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	if len(lines) == 1 {
		return lines[0]
	}

	return fmt.Sprintf("%s (and %d more)", lines[0], len(lines)-1)
}
