package talos

import (
	"context"
	"errors"
	"io"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/protobuf/types/known/emptypb"
)

// EtcdStatus is what a control plane's own etcd member says of itself
// (MachineService.EtcdStatus: Talos asks the local etcd's Maintenance.Status).
type EtcdStatus struct {
	// MemberID is the answering member's ID.
	MemberID uint64
	// Leader is the ID of the member it follows as leader (0: none).
	Leader uint64
	// RaftIndex is its committed raft index; RaftAppliedIndex what it has
	// applied of it.
	RaftIndex        uint64
	RaftAppliedIndex uint64
	// RaftTerm is its raft term.
	RaftTerm uint64
	// IsLearner is true while the member is not yet a voter.
	IsLearner bool
	// Errors are the problems etcd reports with its status: "etcdserver: no
	// leader" and every active alarm ("memberID:... alarm:NOSPACE").
	Errors []string
	// DBSize is the size of its database in bytes.
	DBSize int64
}

// EtcdStatus returns the status of a control plane's own etcd member. A
// member whose etcd does not run makes Talos wait for it: give the call a
// short deadline.
func (c *Client) EtcdStatus(ctx context.Context, node string) (EtcdStatus, error) {
	resp, err := c.c.MachineClient.EtcdStatus(client.WithNode(ctx, node), &emptypb.Empty{})
	if err != nil {
		return EtcdStatus{}, nodeErr(node, "etcd status", err)
	}

	if len(resp.GetMessages()) == 0 || resp.GetMessages()[0].GetMemberStatus() == nil {
		return EtcdStatus{}, nodeErr(node, "etcd status", errors.New("no reply"))
	}

	s := resp.GetMessages()[0].GetMemberStatus()

	return EtcdStatus{
		MemberID:         s.GetMemberId(),
		Leader:           s.GetLeader(),
		RaftIndex:        s.GetRaftIndex(),
		RaftAppliedIndex: s.GetRaftAppliedIndex(),
		RaftTerm:         s.GetRaftTerm(),
		IsLearner:        s.GetIsLearner(),
		Errors:           s.GetErrors(),
		DBSize:           s.GetDbSize(),
	}, nil
}

// EtcdAlarm is an active etcd alarm on one member.
type EtcdAlarm struct {
	// MemberID is the member that raised it.
	MemberID uint64
	// Alarm is its kind: "NOSPACE" (the database reached its quota: etcd
	// takes no more writes) or "CORRUPT".
	Alarm string
}

// EtcdAlarms returns the etcd cluster's active alarms, as a control plane's
// own etcd reports them (MachineService.EtcdAlarmList). Alarms are cluster
// state: any voter lists every member's.
func (c *Client) EtcdAlarms(ctx context.Context, node string) ([]EtcdAlarm, error) {
	resp, err := c.c.MachineClient.EtcdAlarmList(client.WithNode(ctx, node), &emptypb.Empty{})
	if err != nil {
		return nil, nodeErr(node, "etcd alarm list", err)
	}

	if len(resp.GetMessages()) == 0 {
		return nil, nodeErr(node, "etcd alarm list", errors.New("no reply"))
	}

	var out []EtcdAlarm

	for _, a := range resp.GetMessages()[0].GetMemberAlarms() {
		if a.GetAlarm().String() == "NONE" {
			continue
		}

		out = append(out, EtcdAlarm{MemberID: a.GetMemberId(), Alarm: a.GetAlarm().String()})
	}

	return out, nil
}

// EtcdSnapshot streams a snapshot of etcd, taken by a control plane's own
// member (MachineService.EtcdSnapshot: etcd's Maintenance.Snapshot, the
// bbolt database followed by its sha256), into w and returns its size. A
// worker refuses (Unimplemented); give the call a deadline fit for the
// database's size.
func (c *Client) EtcdSnapshot(ctx context.Context, node string, w io.Writer) (int64, error) {
	ctx, cancel := context.WithCancel(client.WithNode(ctx, node))
	defer cancel()

	r, err := c.c.EtcdSnapshot(ctx, &machine.EtcdSnapshotRequest{})
	if err != nil {
		return 0, nodeErr(node, "etcd snapshot", err)
	}
	defer r.Close() //nolint:errcheck

	n, err := io.Copy(w, r)

	return n, nodeErr(node, "etcd snapshot", err)
}
