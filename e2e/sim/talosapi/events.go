package talosapi

import (
	"fmt"

	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// Events streams the target machine's runtime events as machined does
// (v1alpha1_server.go Events): first an empty "hello" event, which
// machinery's EventsWatchV2 waits for, then the past events the request's
// tail asks for and every event after, each as a machine.Event whose data
// is the payload under the type URL "talos/runtime/<message name>". The
// stream ends with Unavailable when the machine goes down, as a stream
// through apid to a rebooting node breaks.
func (ms *machineService) Events(req *machineapi.EventsRequest, srv grpc.ServerStreamingServer[machineapi.Event]) error {
	t, err := ms.s.single(srv.Context(), ms.self)
	if err != nil {
		return err
	}
	past, next, cancel, err := t.m.WatchEvents(machine.EventsTail{
		Events: req.GetTailEvents(), ID: req.GetTailId(), Seconds: req.GetTailSeconds(), ActorID: req.GetWithActorId(),
	})
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Error(codes.InvalidArgument, err.Error())
	}
	defer cancel()
	if err := srv.Send(&machineapi.Event{Data: &anypb.Any{}, Id: t.m.NewEventID(), ActorId: req.GetWithActorId()}); err != nil {
		return err
	}
	for _, ev := range past {
		if err := sendEvent(srv, ev); err != nil {
			return err
		}
	}
	changed, unsubscribe := t.m.Subscribe()
	defer unsubscribe()
	for {
		select {
		case <-srv.Context().Done():
			return srv.Context().Err()
		case ev, ok := <-next:
			if !ok {
				return status.Errorf(codes.Unavailable, "node %s went away: the event stream ended", t.name)
			}
			if err := sendEvent(srv, ev); err != nil {
				return err
			}
		case <-changed:
			if t.m.Reachable() {
				continue
			}
			// What the node published before it went away reached the
			// client; then the stream breaks.
			for {
				select {
				case ev, ok := <-next:
					if !ok {
						return status.Errorf(codes.Unavailable, "node %s went away: the event stream ended", t.name)
					}
					if err := sendEvent(srv, ev); err != nil {
						return err
					}
					continue
				default:
				}
				return status.Errorf(codes.Unavailable, "node %s went away: the event stream ended", t.name)
			}
		}
	}
}

// sendEvent sends one runtime event as Talos serializes it.
func sendEvent(srv grpc.ServerStreamingServer[machineapi.Event], ev machine.RuntimeEvent) error {
	value, err := proto.Marshal(ev.Payload)
	if err != nil {
		return fmt.Errorf("event %s: %w", ev.ID, err)
	}
	return srv.Send(&machineapi.Event{
		Data:    &anypb.Any{TypeUrl: "talos/runtime/" + string(ev.Payload.ProtoReflect().Descriptor().FullName()), Value: value},
		Id:      ev.ID,
		ActorId: ev.ActorID,
	})
}
