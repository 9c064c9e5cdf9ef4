package talosapi

import (
	"context"
	"fmt"
	"sort"
	"time"

	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// Talos answers EtcdStatus and EtcdAlarmList from the control plane's own
// etcd (a client to localhost:2379): a worker refuses them; a stopped etcd
// makes the call wait until the caller's deadline (etcd's client waits for
// the connection), then fail. The simulated members share one raft log: the
// committed index is the same for all at a given moment (it advances with
// time, 100 entries a second), the leader is the first control plane, by
// name, whose etcd runs and that is up.

// etcdLeader returns the member ID of the leader, 0 when no member can lead.
func (s *Server) etcdLeader() uint64 {
	var names []string

	for _, m := range s.machines {
		if m.EtcdMember() && !m.EtcdStopped() {
			if _, err := m.Version(); err == nil {
				names = append(names, m.Name())
			}
		}
	}

	if len(names) == 0 {
		return 0
	}

	sort.Strings(names)

	return machine.EtcdMemberID(names[0])
}

// etcdAlarms are the alarms the members raised, as etcd keeps them.
func (s *Server) etcdAlarms() []*machineapi.EtcdMemberAlarm {
	var out []*machineapi.EtcdMemberAlarm

	for _, m := range s.machines {
		if !m.EtcdMember() || m.EtcdAlarm() == "" {
			continue
		}

		alarm := machineapi.EtcdMemberAlarm_NONE
		if v, ok := machineapi.EtcdMemberAlarm_AlarmType_value[m.EtcdAlarm()]; ok {
			alarm = machineapi.EtcdMemberAlarm_AlarmType(v)
		}

		out = append(out, &machineapi.EtcdMemberAlarm{MemberId: machine.EtcdMemberID(m.Name()), Alarm: alarm})
	}

	return out
}

// etcdRaftIndex is the shared raft log's committed index now.
func etcdRaftIndex() uint64 {
	return uint64(time.Now().UnixMilli() / 10)
}

// waitStoppedEtcd waits, as Talos' etcd client does for a stopped etcd,
// until ctx ends, then returns Talos' error for the call (op, "" for none).
func waitStoppedEtcd(ctx context.Context, op string) error {
	<-ctx.Done()

	err := ctx.Err()
	if op != "" {
		return status.Error(codes.Unknown, fmt.Sprintf("%s: %v", op, err))
	}

	return status.FromContextError(err).Err()
}

// etcdMachine checks the machine runs etcd: up and a control plane.
func etcdMachine(m *machine.Machine, api string) error {
	if _, err := m.Version(); err != nil {
		return err
	}

	if !m.ControlPlane() {
		return status.Errorf(codes.Unimplemented, "%s is only available on control plane nodes", api)
	}

	return nil
}

// EtcdStatus returns the status of the machine's own etcd member.
func (ms *machineService) EtcdStatus(ctx context.Context, _ *emptypb.Empty) (*machineapi.EtcdStatusResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.EtcdStatus { return &machineapi.EtcdStatus{} },
		func(ctx context.Context, m *machine.Machine) (*machineapi.EtcdStatus, error) {
			if err := etcdMachine(m, "etcd status"); err != nil {
				return nil, err
			}

			if m.EtcdStopped() {
				return nil, waitStoppedEtcd(ctx, "failed to query etcd status")
			}

			leader := ms.s.etcdLeader()

			var errs []string
			if leader == 0 {
				errs = append(errs, "etcdserver: no leader")
			}

			// etcd's status lists every active alarm of the cluster.
			for _, a := range ms.s.etcdAlarms() {
				errs = append(errs, fmt.Sprintf("memberID:%d alarm:%s ", a.GetMemberId(), a.GetAlarm()))
			}

			index := etcdRaftIndex()

			return &machineapi.EtcdStatus{MemberStatus: &machineapi.EtcdMemberStatus{
				MemberId:         machine.EtcdMemberID(m.Name()),
				ProtocolVersion:  "3.6.5",
				StorageVersion:   "3.6.0",
				DbSize:           20 << 20,
				DbSizeInUse:      12 << 20,
				Leader:           leader,
				RaftIndex:        index,
				RaftTerm:         2,
				RaftAppliedIndex: index,
				Errors:           errs,
			}}, nil
		})
	if err != nil {
		return nil, err
	}

	return &machineapi.EtcdStatusResponse{Messages: msgs}, nil
}

// EtcdAlarmList lists the cluster's active alarms, as the machine's own
// etcd reports them.
func (ms *machineService) EtcdAlarmList(ctx context.Context, _ *emptypb.Empty) (*machineapi.EtcdAlarmListResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.EtcdAlarm { return &machineapi.EtcdAlarm{} },
		func(ctx context.Context, m *machine.Machine) (*machineapi.EtcdAlarm, error) {
			if err := etcdMachine(m, "etcd alarm list"); err != nil {
				return nil, err
			}

			if m.EtcdStopped() {
				return nil, waitStoppedEtcd(ctx, "failed to list etcd alarms")
			}

			return &machineapi.EtcdAlarm{MemberAlarms: ms.s.etcdAlarms()}, nil
		})
	if err != nil {
		return nil, err
	}

	return &machineapi.EtcdAlarmListResponse{Messages: msgs}, nil
}
