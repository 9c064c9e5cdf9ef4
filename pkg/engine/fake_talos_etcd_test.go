package engine

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

func (o *fakeOS) EtcdMembers(ctx context.Context, ip string) ([]talos.EtcdMember, error) {
	self, err := o.reachable(ctx, ip)
	if err != nil {
		return nil, fmt.Errorf("node %q: list etcd members: %w", ip, err)
	}

	if !self.controlPlane {
		return nil, fmt.Errorf("node %q: list etcd members: %w", ip, status.Error(codes.FailedPrecondition, "etcd is not running on this node"))
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	var out []talos.EtcdMember

	for i, fm := range o.f.machines {
		m := o.machines[fm.name]
		if !m.controlPlane {
			continue
		}

		learner := m.faults.learner || (m.faults.learnerAfterBoot > 0 && time.Since(m.bootedAt) < m.faults.learnerAfterBoot)
		out = append(out, talos.EtcdMember{ID: uint64(i + 1), Hostname: m.name, IsLearner: learner})
	}

	return out, nil
}

// etcdMember returns the control plane's member ID (its index + 1) and
// whether it is a learner now; the caller holds o.mu.
func (o *fakeOS) etcdMember(name string) (uint64, bool) {
	for i, fm := range o.f.machines {
		if fm.name == name {
			m := o.machines[name]

			return uint64(i + 1), m.faults.learner || (m.faults.learnerAfterBoot > 0 && time.Since(m.bootedAt) < m.faults.learnerAfterBoot)
		}
	}

	return 0, false
}

// EtcdStatus is the control plane's own member: the first control plane
// leads, at raft index 5000 and on by raftRate entries a second; a stopped
// etcd answers nothing until the caller gives up.
func (o *fakeOS) EtcdStatus(ctx context.Context, ip string) (talos.EtcdStatus, error) {
	self, err := o.reachable(ctx, ip)
	if err != nil {
		return talos.EtcdStatus{}, fmt.Errorf("node %q: etcd status: %w", ip, err)
	}

	o.mu.Lock()
	stopped, delay := self.faults.etcdStopped, self.faults.etcdStatusDelay
	o.mu.Unlock()

	if !self.controlPlane {
		return talos.EtcdStatus{}, fmt.Errorf("node %q: etcd status: %w", ip, status.Error(codes.FailedPrecondition, "etcd is not running on this node"))
	}

	if stopped {
		<-ctx.Done()

		return talos.EtcdStatus{}, fmt.Errorf("node %q: etcd status: %w", ip, status.FromContextError(ctx.Err()).Err())
	}

	if delay > 0 {
		select {
		case <-ctx.Done():
			return talos.EtcdStatus{}, fmt.Errorf("node %q: etcd status: %w", ip, status.FromContextError(ctx.Err()).Err())
		case <-time.After(delay):
		}
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	index := 5000 + uint64(o.raftRate*time.Since(o.started).Seconds()) - self.faults.etcdLag

	switch {
	case !self.faults.etcdStalled:
		self.stalledAt = 0
	case self.stalledAt == 0:
		self.stalledAt = index
	default:
		index = self.stalledAt
	}

	id, learner := o.etcdMember(self.name)
	s := talos.EtcdStatus{MemberID: id, Leader: 1, RaftIndex: index, RaftTerm: 2, IsLearner: learner}

	for _, m := range o.machines {
		if m.faults.etcdAlarm != "" {
			mid, _ := o.etcdMember(m.name)
			s.Errors = append(s.Errors, fmt.Sprintf("memberID:%d alarm:%s ", mid, m.faults.etcdAlarm))
		}
	}

	return s, nil
}

// EtcdAlarms lists every member's alarm.
func (o *fakeOS) EtcdAlarms(ctx context.Context, ip string) ([]talos.EtcdAlarm, error) {
	if _, err := o.reachable(ctx, ip); err != nil {
		return nil, fmt.Errorf("node %q: etcd alarm list: %w", ip, err)
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	var out []talos.EtcdAlarm

	for _, m := range o.machines {
		if m.faults.etcdAlarm != "" {
			id, _ := o.etcdMember(m.name)
			out = append(out, talos.EtcdAlarm{MemberID: id, Alarm: m.faults.etcdAlarm})
		}
	}

	return out, nil
}
