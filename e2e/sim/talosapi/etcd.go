package talosapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// Talos answers EtcdStatus and EtcdAlarmList from the control plane's own
// etcd (a client to localhost:2379, dialled anew for each call): a worker
// refuses them; a stopped etcd makes the call wait until the caller's
// deadline (etcd's client waits for the connection), then fail. The leader
// is the first control plane, by name, whose etcd runs and that is up.
//
// The simulated members share one raft log: the real etcd's of the cluster
// (Options.EtcdURL), whose Maintenance.Status gives the committed index
// (raftIndex), the applied index (raftAppliedIndex) and the term, so that
// the cluster's real write load (every write through the API server is a
// raft entry) moves them as it moves a real member's. Each status is read
// at the moment its call reaches the member: two members read at different
// moments report different indexes, as real members read through apid do
// (without an etcd, a counter of 100 entries a second stands in). A member
// under etcdStalled answers, but its indexes stay at those of its first
// status under the fault (its raft stopped: a full disk, a wedged apply
// loop); etcdStatusLatency delays its status by that long before it is read
// (a loaded node: Talos dials a new etcd client for each call).

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

// raftPoint is where a member's raft log stands: its committed and applied
// indexes and its term.
type raftPoint struct {
	committed, applied, term uint64
}

// etcdRaft reads the shared raft log's point now: the real etcd's status, or
// the counter when the simulated cluster has no etcd.
func (s *Server) etcdRaft(ctx context.Context) (raftPoint, error) {
	if s.etcdURL == "" {
		index := uint64(time.Now().UnixMilli() / 10)

		return raftPoint{committed: index, applied: index, term: 2}, nil
	}

	ctx, cancel := context.WithTimeout(ctx, etcdStatusTimeout)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.etcdURL+"/v3/maintenance/status", strings.NewReader("{}"))
	if err != nil {
		return raftPoint{}, err
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return raftPoint{}, err
	}
	defer resp.Body.Close() //nolint:errcheck

	if resp.StatusCode != http.StatusOK {
		return raftPoint{}, fmt.Errorf("etcd answered %s", resp.Status)
	}

	// grpc-gateway writes uint64 fields as JSON strings.
	var st struct {
		RaftIndex        json.Number `json:"raftIndex"`
		RaftAppliedIndex json.Number `json:"raftAppliedIndex"`
		RaftTerm         json.Number `json:"raftTerm"`
	}

	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return raftPoint{}, fmt.Errorf("decode etcd status: %w", err)
	}

	var p raftPoint

	for _, f := range []struct {
		n   json.Number
		out *uint64
	}{{st.RaftIndex, &p.committed}, {st.RaftAppliedIndex, &p.applied}, {st.RaftTerm, &p.term}} {
		if f.n == "" {
			continue
		}

		if *f.out, err = strconv.ParseUint(string(f.n), 10, 64); err != nil {
			return raftPoint{}, fmt.Errorf("decode etcd status: %w", err)
		}
	}

	return p, nil
}

// etcdStatusTimeout bounds a read of the real etcd's status.
const etcdStatusTimeout = 2 * time.Second

// memberRaft is where member m's raft log stands now, read after its status
// latency: the shared log's point, or under etcdStalled the point it stalled
// at (its first read under the fault).
func (s *Server) memberRaft(ctx context.Context, m *machine.Machine) (raftPoint, error) {
	f := m.Faults()
	if d := f.EtcdStatusLatency.Duration; d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return raftPoint{}, ctx.Err()
		}
	}

	s.raftMu.Lock()
	stalled, ok := s.stalled[m.Name()]
	if !f.EtcdStalled {
		delete(s.stalled, m.Name())
	}
	s.raftMu.Unlock()

	if f.EtcdStalled && ok {
		return stalled, nil
	}

	p, err := s.etcdRaft(ctx)
	if err != nil || !f.EtcdStalled {
		return p, err
	}

	s.raftMu.Lock()
	defer s.raftMu.Unlock()

	if prev, ok := s.stalled[m.Name()]; ok {
		return prev, nil
	}

	s.stalled[m.Name()] = p

	return p, nil
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

			raft, err := ms.s.memberRaft(ctx, m)
			if err != nil {
				return nil, status.Error(codes.Unknown, fmt.Sprintf("failed to query etcd status: %v", err))
			}

			return &machineapi.EtcdStatus{MemberStatus: &machineapi.EtcdMemberStatus{
				MemberId:         machine.EtcdMemberID(m.Name()),
				ProtocolVersion:  "3.6.5",
				StorageVersion:   "3.6.0",
				DbSize:           20 << 20,
				DbSizeInUse:      12 << 20,
				Leader:           leader,
				RaftIndex:        raft.committed,
				RaftTerm:         raft.term,
				RaftAppliedIndex: raft.applied,
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

// etcdValidateForUpgrade is Talos' etcd check of a control plane's
// MachineService.Upgrade (internal/pkg/etcd Client.ValidateForUpgrade): an
// etcd of two members would lose its quorum; every member must be started
// and answer a quorum read (Talos waits 15 s for each; the simulator knows
// at once: a member whose machine is down or whose etcd is stopped does not
// answer).
func (s *Server) etcdValidateForUpgrade(context.Context) error {
	var members []*machine.Machine

	for _, m := range s.machines {
		if m.ControlPlane() {
			members = append(members, m)
		}
	}

	if len(members) == 2 {
		return fmt.Errorf("etcd member count(%d) is insufficient to maintain quorum if upgrade commences", len(members))
	}

	for _, m := range members {
		if _, err := m.Version(); err != nil || m.EtcdStopped() {
			return fmt.Errorf("etcd member %016x is not healthy; all members must be healthy to perform an upgrade: context deadline exceeded",
				machine.EtcdMemberID(m.Name()))
		}
	}

	return nil
}

// EtcdSnapshot streams a snapshot of etcd as Talos takes it from the control
// plane's own member (etcd's Maintenance.Snapshot: the bbolt database, then
// its sha256), in common.Data chunks. The simulated members share the one
// real etcd of the cluster: its snapshot is read through etcd's gRPC gateway
// (POST /v3/maintenance/snapshot, a stream of JSON results). A worker
// refuses as Talos does; a stopped member waits for the caller's deadline.
func (ms *machineService) EtcdSnapshot(_ *machineapi.EtcdSnapshotRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	t, err := ms.s.single(srv.Context(), ms.self)
	if err != nil {
		return err
	}

	if err := etcdMachine(t.m, "etcd snapshot"); err != nil {
		return err
	}

	if t.m.EtcdStopped() {
		return waitStoppedEtcd(srv.Context(), "failed reading etcd snapshot")
	}

	if ms.s.etcdURL == "" {
		return status.Error(codes.Unknown, "failed to create etcd client: the simulated cluster has no etcd")
	}

	req, err := http.NewRequestWithContext(srv.Context(), http.MethodPost, ms.s.etcdURL+"/v3/maintenance/snapshot", strings.NewReader("{}"))
	if err != nil {
		return err
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return status.Errorf(codes.Unknown, "failed reading etcd snapshot: %v", err)
	}
	defer resp.Body.Close() //nolint:errcheck

	if resp.StatusCode != http.StatusOK {
		return status.Errorf(codes.Unknown, "failed reading etcd snapshot: etcd answered %s", resp.Status)
	}

	dec := json.NewDecoder(resp.Body)

	for {
		var msg struct {
			Result *struct {
				Blob []byte `json:"blob"`
			} `json:"result"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}

		err := dec.Decode(&msg)

		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return status.Errorf(codes.Unknown, "failed reading etcd snapshot: %v", err)
		case msg.Error != nil:
			return status.Errorf(codes.Unknown, "failed reading etcd snapshot: %s", msg.Error.Message)
		case msg.Result != nil && len(msg.Result.Blob) > 0:
			if err := srv.Send(&common.Data{Bytes: msg.Result.Blob}); err != nil {
				return err
			}
		}
	}
}
