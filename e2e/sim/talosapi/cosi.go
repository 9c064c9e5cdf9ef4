package talosapi

import (
	"context"
	"time"

	cosiapi "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// routedState is the COSI core state of one endpoint: it serves each call
// from the COSI state of the machine the call is routed to, through Talos'
// access policy (see accessPolicy), so writes are refused.
type routedState struct {
	s    *Server
	self *machine.Machine
}

var _ state.CoreState = (*routedState)(nil)

func (r *routedState) target(ctx context.Context) (state.CoreState, error) {
	t, err := r.s.single(ctx, r.self)
	if err != nil {
		return nil, err
	}
	st := t.m.COSI()
	return state.Filter(st, accessPolicy(st)), nil
}

// Get implements state.CoreState.
func (r *routedState) Get(ctx context.Context, ptr resource.Pointer, opts ...state.GetOption) (resource.Resource, error) {
	st, err := r.target(ctx)
	if err != nil {
		return nil, err
	}
	return st.Get(ctx, ptr, opts...)
}

// List implements state.CoreState.
func (r *routedState) List(ctx context.Context, kind resource.Kind, opts ...state.ListOption) (resource.List, error) {
	st, err := r.target(ctx)
	if err != nil {
		return resource.List{}, err
	}
	return st.List(ctx, kind, opts...)
}

// Create implements state.CoreState.
func (r *routedState) Create(ctx context.Context, res resource.Resource, opts ...state.CreateOption) error {
	st, err := r.target(ctx)
	if err != nil {
		return err
	}
	return st.Create(ctx, res, opts...)
}

// Update implements state.CoreState.
func (r *routedState) Update(ctx context.Context, res resource.Resource, opts ...state.UpdateOption) error {
	st, err := r.target(ctx)
	if err != nil {
		return err
	}
	return st.Update(ctx, res, opts...)
}

// Destroy implements state.CoreState.
func (r *routedState) Destroy(ctx context.Context, ptr resource.Pointer, opts ...state.DestroyOption) error {
	st, err := r.target(ctx)
	if err != nil {
		return err
	}
	return st.Destroy(ctx, ptr, opts...)
}

// Watch implements state.CoreState.
func (r *routedState) Watch(ctx context.Context, ptr resource.Pointer, ch chan<- state.Event, opts ...state.WatchOption) error {
	st, err := r.target(ctx)
	if err != nil {
		return err
	}
	return st.Watch(ctx, ptr, ch, opts...)
}

// WatchKind implements state.CoreState.
func (r *routedState) WatchKind(ctx context.Context, kind resource.Kind, ch chan<- state.Event, opts ...state.WatchKindOption) error {
	st, err := r.target(ctx)
	if err != nil {
		return err
	}
	return st.WatchKind(ctx, kind, ch, opts...)
}

// WatchKindAggregated implements state.CoreState.
func (r *routedState) WatchKindAggregated(ctx context.Context, kind resource.Kind, ch chan<- []state.Event, opts ...state.WatchKindOption) error {
	st, err := r.target(ctx)
	if err != nil {
		return err
	}
	return st.WatchKindAggregated(ctx, kind, ch, opts...)
}

// stateService is the COSI State gRPC service of one endpoint. Its Watch
// ends with Unavailable when the watched machine goes down, as a watch
// through apid to a rebooting node breaks.
type stateService struct {
	*server.State

	s    *Server
	self *machine.Machine
}

type watchStream struct {
	grpc.ServerStreamingServer[cosiapi.WatchResponse]
	ctx context.Context //nolint:containedctx // overrides the stream context
}

func (w watchStream) Context() context.Context { return w.ctx }

// Watch implements cosiapi.StateServer.
func (ss *stateService) Watch(req *cosiapi.WatchRequest, srv grpc.ServerStreamingServer[cosiapi.WatchResponse]) error {
	t, err := ss.s.single(srv.Context(), ss.self)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(srv.Context())
	defer cancel()
	lost := make(chan struct{})
	go func() {
		ch, unsubscribe := t.m.Subscribe()
		defer unsubscribe()
		tick := time.NewTicker(reconcileInterval)
		defer tick.Stop()
		for {
			if !t.m.Reachable() {
				close(lost)
				cancel()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-ch:
			case <-tick.C:
			}
		}
	}()
	err = ss.State.Watch(req, watchStream{ServerStreamingServer: srv, ctx: ctx})
	select {
	case <-lost:
		return status.Errorf(codes.Unavailable, "node %s went away: the watch ended", t.name)
	default:
		return err
	}
}
