package talosapi

import (
	"context"
	"fmt"

	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// ServiceList lists the target machine's services with their state, health
// and recent events (talosctl service).
func (ms *machineService) ServiceList(ctx context.Context, _ *emptypb.Empty) (*machineapi.ServiceListResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.ServiceList { return &machineapi.ServiceList{} },
		func(_ context.Context, m *machine.Machine) (*machineapi.ServiceList, error) {
			svcs, err := m.Services()
			if err != nil {
				return nil, err
			}
			return &machineapi.ServiceList{Services: svcs}, nil
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.ServiceListResponse{Messages: msgs}, nil
}

// ServiceStart starts a service Talos allows to start from the API (the
// kubelet).
func (ms *machineService) ServiceStart(ctx context.Context, req *machineapi.ServiceStartRequest) (*machineapi.ServiceStartResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.ServiceStart { return &machineapi.ServiceStart{} },
		func(ctx context.Context, m *machine.Machine) (*machineapi.ServiceStart, error) {
			if err := m.ServiceAction(ctx, req.GetId(), "start"); err != nil {
				return nil, err
			}
			return &machineapi.ServiceStart{Resp: fmt.Sprintf("Service %q started", req.GetId())}, nil
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.ServiceStartResponse{Messages: msgs}, nil
}

// ServiceStop stops a service Talos allows to stop from the API (none of
// those the simulator runs).
func (ms *machineService) ServiceStop(ctx context.Context, req *machineapi.ServiceStopRequest) (*machineapi.ServiceStopResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.ServiceStop { return &machineapi.ServiceStop{} },
		func(ctx context.Context, m *machine.Machine) (*machineapi.ServiceStop, error) {
			if err := m.ServiceAction(ctx, req.GetId(), "stop"); err != nil {
				return nil, err
			}
			return &machineapi.ServiceStop{Resp: fmt.Sprintf("Service %q stopped", req.GetId())}, nil
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.ServiceStopResponse{Messages: msgs}, nil
}

// ServiceRestart restarts a service Talos allows to restart from the API
// (the kubelet): its Service resource is destroyed, then created again.
func (ms *machineService) ServiceRestart(ctx context.Context, req *machineapi.ServiceRestartRequest) (*machineapi.ServiceRestartResponse, error) {
	msgs, err := fanOut(ctx, ms.s, ms.self, func() *machineapi.ServiceRestart { return &machineapi.ServiceRestart{} },
		func(ctx context.Context, m *machine.Machine) (*machineapi.ServiceRestart, error) {
			if err := m.ServiceAction(ctx, req.GetId(), "restart"); err != nil {
				return nil, err
			}
			return &machineapi.ServiceRestart{Resp: fmt.Sprintf("Service %q restarted", req.GetId())}, nil
		})
	if err != nil {
		return nil, err
	}
	return &machineapi.ServiceRestartResponse{Messages: msgs}, nil
}
