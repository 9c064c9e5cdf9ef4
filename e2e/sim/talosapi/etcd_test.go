package talosapi_test

import (
	"context"
	"os"
	"testing"
	"time"

	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/emptypb"

	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// TestEtcdCalls: a control plane answers EtcdStatus and EtcdAlarmList as
// Talos does from its own etcd; a worker refuses them; the etcdAlarm fault
// shows in the alarm list and among every member's errors; an etcdStopped
// member makes the calls wait for the caller's deadline, while a cluster-
// wide member list still lists it.
func TestEtcdCalls(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := c.client(t, c.talosconf)
	ctx := client.WithNode(t.Context(), c.cpIP)
	id := simmachine.EtcdMemberID("cp-1")

	setFaults := func(doc string) {
		t.Helper()
		// Each document differs in size: the store re-reads it at once.
		require.NoError(t, os.WriteFile(c.faults, []byte(doc), 0o644))
	}

	t.Run("healthy", func(t *testing.T) {
		resp, err := cl.MachineClient.EtcdStatus(ctx, &emptypb.Empty{})
		require.NoError(t, err)
		require.Len(t, resp.GetMessages(), 1)
		s := resp.GetMessages()[0].GetMemberStatus()
		assert.Equal(t, id, s.GetMemberId())
		assert.Equal(t, id, s.GetLeader(), "the only member leads")
		assert.NotZero(t, s.GetRaftIndex())
		assert.Empty(t, s.GetErrors())
		assert.False(t, s.GetIsLearner())

		alarms, err := cl.MachineClient.EtcdAlarmList(ctx, &emptypb.Empty{})
		require.NoError(t, err)
		assert.Empty(t, alarms.GetMessages()[0].GetMemberAlarms())
	})

	t.Run("a worker runs no etcd", func(t *testing.T) {
		_, err := cl.MachineClient.EtcdStatus(client.WithNode(t.Context(), c.wIP), &emptypb.Empty{})
		assert.Equal(t, codes.Unimplemented, client.StatusCode(err), "%v", err)
		assert.ErrorContains(t, err, "etcd status is only available on control plane nodes")
	})

	t.Run("an alarm", func(t *testing.T) {
		setFaults("nodes:\n  cp-1:\n    etcdAlarm: NOSPACE\n")
		defer setFaults("nodes: {}\n")

		alarms, err := cl.MachineClient.EtcdAlarmList(ctx, &emptypb.Empty{})
		require.NoError(t, err)
		assert.Equal(t, []*machineapi.EtcdMemberAlarm{{MemberId: id, Alarm: machineapi.EtcdMemberAlarm_NOSPACE}},
			alarms.GetMessages()[0].GetMemberAlarms())

		resp, err := cl.MachineClient.EtcdStatus(ctx, &emptypb.Empty{})
		require.NoError(t, err)
		assert.Len(t, resp.GetMessages()[0].GetMemberStatus().GetErrors(), 1)
		assert.Contains(t, resp.GetMessages()[0].GetMemberStatus().GetErrors()[0], "alarm:NOSPACE")
	})

	t.Run("stopped but listed", func(t *testing.T) {
		setFaults("nodes:\n  cp-1:\n    etcdStopped: true\n")
		defer setFaults("nodes: {}\n")

		callCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()

		_, err := cl.MachineClient.EtcdStatus(callCtx, &emptypb.Empty{})
		assert.Equal(t, codes.DeadlineExceeded, client.StatusCode(err), "%v", err)

		members, err := cl.EtcdMemberList(ctx, &machineapi.EtcdMemberListRequest{})
		require.NoError(t, err)
		require.Len(t, members.GetMessages()[0].GetMembers(), 1)
		assert.Equal(t, "cp-1", members.GetMessages()[0].GetMembers()[0].GetHostname())
	})
}

// TestEtcdMemberJoinsOnFirstBoot: a control plane powered off since the start
// is no etcd member and its Talos API is unreachable; switched on, it boots and
// its member is listed, the first control plane still leading.
func TestEtcdMemberJoinsOnFirstBoot(t *testing.T) {
	t.Parallel()
	c := newJoiningCluster(t)
	cl := c.client(t, c.talosconf)
	ctx := client.WithNode(t.Context(), c.cpIP)

	hostnames := func() []string {
		t.Helper()
		members, err := cl.EtcdMemberList(ctx, &machineapi.EtcdMemberListRequest{})
		require.NoError(t, err)
		var out []string
		for _, m := range members.GetMessages()[0].GetMembers() {
			out = append(out, m.GetHostname())
		}
		return out
	}

	assert.Equal(t, []string{"cp-1"}, hostnames())
	assert.False(t, c.joining.Reachable())

	require.NoError(t, os.WriteFile(c.faults, []byte("nodes: {}\n"), 0o644))
	require.Eventually(t, c.joining.Reachable, 10*time.Second, 50*time.Millisecond, "cp-2 boots")

	assert.Equal(t, []string{"cp-1", "cp-2"}, hostnames())

	resp, err := cl.MachineClient.EtcdStatus(client.WithNode(t.Context(), c.joining.IP().String()), &emptypb.Empty{})
	require.NoError(t, err)
	assert.Equal(t, simmachine.EtcdMemberID("cp-1"), resp.GetMessages()[0].GetMemberStatus().GetLeader())
	assert.Equal(t, simmachine.EtcdMemberID("cp-2"), resp.GetMessages()[0].GetMemberStatus().GetMemberId())
}

// TestEtcdRaftIndexes: a member's raft indexes are read at the moment its
// status call reaches it, so they move between two reads; etcdStatusLatency
// answers that late, with the indexes of that later moment; etcdStalled
// keeps them where its first read under the fault found them, while the
// shared log moves on; cleared, they move again.
func TestEtcdRaftIndexes(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := c.client(t, c.talosconf)
	ctx := client.WithNode(t.Context(), c.cpIP)

	setFaults := func(doc string) {
		t.Helper()
		require.NoError(t, os.WriteFile(c.faults, []byte(doc), 0o644))
	}

	read := func() *machineapi.EtcdMemberStatus {
		t.Helper()
		resp, err := cl.MachineClient.EtcdStatus(ctx, &emptypb.Empty{})
		require.NoError(t, err)
		return resp.GetMessages()[0].GetMemberStatus()
	}

	first := read()
	assert.Equal(t, first.GetRaftIndex(), first.GetRaftAppliedIndex(), "applied what it committed")
	time.Sleep(50 * time.Millisecond)
	assert.Greater(t, read().GetRaftIndex(), first.GetRaftIndex(), "the log moves on")

	setFaults("nodes:\n  cp-1:\n    etcdStatusLatency: 300ms\n")
	start := time.Now()
	late := read()
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "answered late")
	assert.Greater(t, late.GetRaftIndex(), first.GetRaftIndex())

	setFaults("nodes:\n  cp-1:\n    etcdStalled: true\n")
	stalled := read()
	time.Sleep(50 * time.Millisecond)
	again := read()
	assert.Equal(t, stalled.GetRaftIndex(), again.GetRaftIndex(), "stalled: its committed index stays")
	assert.Equal(t, stalled.GetRaftAppliedIndex(), again.GetRaftAppliedIndex(), "stalled: its applied index stays")
	assert.Empty(t, again.GetErrors(), "a stalled member still answers")

	setFaults("nodes: {}\n")
	assert.Greater(t, read().GetRaftIndex(), stalled.GetRaftIndex(), "cleared, it moves again")
}
