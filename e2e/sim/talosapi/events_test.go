package talosapi_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// readyEvent reports whether an event says the machine runs and is ready,
// talosctl's action.MachineReadyEventFn.
func readyEvent(ev client.EventResult) bool {
	s, ok := ev.Event.Payload.(*machineapi.MachineStatusEvent)
	return ok && s.GetStage() == machineapi.MachineStatusEvent_RUNNING && s.GetStatus().GetReady()
}

// waitReadyEvent watches the whole tail of the node's events until one says
// it runs and is ready, as talosctl's tracker does after a reboot (it
// retries while the node is down); the kubelet's Node Ready is reported on
// the way, as the simulated kubelet would.
func waitReadyEvent(t *testing.T, cl *client.Client, ctx context.Context, m *simmachine.Machine, tail client.EventsOptionFunc) { //nolint:revive // test helper
	t.Helper()
	require.Eventually(t, func() bool {
		m.ObserveKubelet(simmachine.KubeletView{NodeReady: true})
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		ch := make(chan client.EventResult)
		if err := cl.EventsWatchV2(wctx, ch, tail); err != nil {
			return false
		}
		for {
			select {
			case ev := <-ch:
				if readyEvent(ev) {
					return true
				}
				if ev.Error != nil {
					return false
				}
			case <-wctx.Done():
				return false
			}
		}
	}, 20*time.Second, 100*time.Millisecond, "a MachineStatusEvent running and ready")
}

// A reboot asked through the API is followed as talosctl reboot follows it
// (cmd/talosctl/pkg/talos/action): a watch from now, then the reboot's
// actor ID, the actor's reboot sequence and its stopAllServices task, the
// watch broken when the node goes down; watched again with the whole tail,
// the new boot says running and ready, and the boot ID changed.
func TestEventsFollowAReboot(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := c.clientVia(t, c.cpIP)
	ctx, cancel := context.WithTimeout(client.WithNode(t.Context(), c.wIP), time.Minute)
	defer cancel()

	waitReadyEvent(t, cl, ctx, c.worker, client.WithTailEvents(-1))
	before := readBootID(t, cl, ctx)

	ch := make(chan client.EventResult)
	require.NoError(t, cl.EventsWatchV2(ctx, ch, client.WithTailEvents(0)), "the hello event comes first")

	resp, err := cl.RebootWithResponse(ctx)
	require.NoError(t, err)
	actor := resp.GetMessages()[0].GetActorId()
	require.NotEmpty(t, actor)

	var (
		mine   []string
		ended  error
		lastID string
	)
	for ended == nil {
		select {
		case ev := <-ch:
			if ev.Error != nil {
				ended = ev.Error
				break
			}
			assert.Len(t, ev.Event.ID, 20, "an xid")
			assert.Greater(t, ev.Event.ID, lastID, "IDs increase")
			lastID = ev.Event.ID
			if ev.Event.ActorID != actor {
				continue
			}
			switch p := ev.Event.Payload.(type) {
			case *machineapi.SequenceEvent:
				mine = append(mine, fmt.Sprintf("sequence %s %s", p.GetSequence(), p.GetAction()))
			case *machineapi.TaskEvent:
				mine = append(mine, fmt.Sprintf("task %s %s", p.GetTask(), p.GetAction()))
			}
		case <-ctx.Done():
			t.Fatalf("the watch did not end with the reboot; the actor's events: %v", mine)
		}
	}
	require.NotEmpty(t, mine)
	assert.Equal(t, "sequence reboot START", mine[0])
	assert.Contains(t, mine, "task stopAllServices START")
	assert.Equal(t, codes.Unavailable, client.StatusCode(ended), "the watch breaks when the node goes down: %v", ended)

	waitReadyEvent(t, cl, ctx, c.worker, client.WithTailID(lastID))
	waitReadyEvent(t, cl, ctx, c.worker, client.WithTailEvents(-1))
	assert.NotEqual(t, before, readBootID(t, cl, ctx), "a new boot")
}

// The tail options and the actor filter choose what a watch starts with, as
// in Talos; the boot's stream is the boot's own.
func TestEventsTail(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := c.clientVia(t, c.cpIP)
	ctx, cancel := context.WithTimeout(client.WithNode(t.Context(), c.wIP), time.Minute)
	defer cancel()
	waitReadyEvent(t, cl, ctx, c.worker, client.WithTailEvents(-1))

	// The past events of a watch, read until the stream goes quiet.
	past := func(opts ...client.EventsOptionFunc) []client.Event {
		t.Helper()
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := make(chan client.EventResult)
		require.NoError(t, cl.EventsWatchV2(wctx, ch, opts...))
		var out []client.Event
		for {
			select {
			case ev := <-ch:
				require.NoError(t, ev.Error)
				out = append(out, ev.Event)
			case <-time.After(300 * time.Millisecond):
				return out
			}
		}
	}

	all := past(client.WithTailEvents(-1))
	require.NotEmpty(t, all)
	first, ok := all[0].Payload.(*machineapi.SequenceEvent)
	require.True(t, ok, "the boot's first event is its first sequence: %T", all[0].Payload)
	assert.Equal(t, "initialize", first.GetSequence())
	assert.Empty(t, past(), "no tail: only what comes next")
	assert.Len(t, past(client.WithTailEvents(2)), 2)
	after := past(client.WithTailID(all[0].ID))
	require.GreaterOrEqual(t, len(after), len(all)-1)
	assert.Equal(t, all[1:], after[:len(all)-1], "the events after that ID")
	assert.Empty(t, past(client.WithTailEvents(-1), client.WithActorID("nobody")))
}

// Through the API, a reference nobody serves fails as on Talos: ImageService
// NotFound with containerd's words, LifecycleService Internal when the
// installer is not in the store.
func TestImagesNotFoundOverTheAPI(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	cl := c.client(t, c.talosconf)
	ctx := client.WithNode(t.Context(), c.wIP)
	system := &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_SYSTEM}

	const missing = "ghcr.io/siderolabs/installer:v1.14.1"
	pull, err := cl.ImageClient.Pull(ctx, &machineapi.ImageServicePullRequest{Containerd: system, ImageRef: missing})
	require.NoError(t, err)
	_, err = pull.Recv()
	require.Error(t, err)
	assert.Equal(t, codes.NotFound, client.StatusCode(err))
	assert.Equal(t, fmt.Sprintf("error pulling image: failed to pull image %q: failed to resolve reference %q: %s: not found", missing, missing, missing),
		client.Status(err).Message())

	up, err := cl.LifecycleClient.Upgrade(ctx, &machineapi.LifecycleServiceUpgradeRequest{
		Containerd: system, Source: &machineapi.InstallArtifactsSource{ImageName: installer1141},
	})
	require.NoError(t, err)
	for {
		_, err = up.Recv()
		if err != nil {
			break
		}
	}
	require.False(t, errors.Is(err, io.EOF), "the call fails")
	assert.Equal(t, codes.Internal, client.StatusCode(err))
	assert.Contains(t, client.Status(err).Message(), "not found in containerd store")
	assert.Empty(t, c.worker.State().StagedVersion)
}
