package stages

import (
	"context"
	"fmt"
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
// ichor does, before it cordons a control plane: every member answers its
// status through Talos (reachable, no error, no alarm such as NOSPACE, not a
// learner, its raft index close to the leader's), every control plane has a
// member, and the voters left while this one is down still make a quorum.
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

// EtcdMaxRaftLag is how far, in raft entries, a member's committed index may
// trail the most advanced one read and still count as in step. The statuses
// are read within a moment of each other; a member that is catching up after
// a restart, or a slow disk, lags by far more.
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
	// Members is the member list, as ListedBy's etcd reports it; ListErr
	// why no control plane could list them.
	Members  []talos.EtcdMember
	ListedBy string
	ListErr  error
	// Alarms are the active alarms; AlarmsErr why they could not be read.
	Alarms    []talos.EtcdAlarm
	AlarmsErr error
}

// ReadEtcd reads every control plane's member status at once, then the
// member list and the alarms from a control plane whose member answered
// without errors. Each call is bounded; nothing here fails: what could not be
// read is in the view, for Judge.
func ReadEtcd(ctx context.Context, r EtcdReader, controlPlanes []EtcdNode) *EtcdView {
	v := &EtcdView{
		ControlPlanes: controlPlanes,
		Status:        map[string]talos.EtcdStatus{},
		StatusErr:     map[string]error{},
	}

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
				v.StatusErr[n.Name] = err
			} else {
				v.Status[n.Name] = s
			}
		})
	}

	wg.Wait()

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
		out.Problems = append(out.Problems, "etcd member list: "+firstLine(v.ListErr))
	}

	if v.AlarmsErr != nil && v.ListErr == nil {
		out.Problems = append(out.Problems, "etcd alarm list: "+firstLine(v.AlarmsErr))
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

	var lead uint64

	for _, s := range v.Status {
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
					problem += " (its etcd status: " + firstLine(err) + ")"
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
		problems = append(problems, "does not answer etcd status: "+firstLine(v.StatusErr[n.Name]))
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

		if lead > s.RaftIndex && lead-s.RaftIndex > EtcdMaxRaftLag {
			problems = append(problems, fmt.Sprintf("raft index %d is %d behind the leader's %d", s.RaftIndex, lead-s.RaftIndex, lead))
		}
	}

	return strings.Join(slices.Compact(problems), ", ")
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
