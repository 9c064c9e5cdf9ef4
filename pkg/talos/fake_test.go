package talos

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"

	cosiapi "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	cosiserver "github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// fakeNode is a minimal in-process Talos API for the client's own logic
// (fallbacks, stream draining, reply handling). It is no simulator: the
// end-to-end simulator lives in e2e/sim and is tested against separately.
type fakeNode struct {
	machine.UnimplementedMachineServiceServer

	imageService     bool   // ImageService.Pull implemented
	legacyPull       bool   // MachineService.ImagePull implemented
	lifecycleService bool   // LifecycleService.Upgrade implemented
	exitCode         int32  // LifecycleService.Upgrade's exit code
	platform         string // Version's platform name ("" none)

	mu    sync.Mutex
	calls []string
	apply *machine.ApplyConfigurationRequest
	pulls []*machine.ImageServicePullRequest
}

func (f *fakeNode) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()

	f.calls = append(f.calls, call)
}

func (f *fakeNode) recorded() []string {
	f.mu.Lock()
	defer f.mu.Unlock()

	return append([]string(nil), f.calls...)
}

func (f *fakeNode) Version(context.Context, *emptypb.Empty) (*machine.VersionResponse, error) {
	v := &machine.Version{Version: &machine.VersionInfo{Tag: "v1.13.9"}}
	if f.platform != "" {
		v.Platform = &machine.PlatformInfo{Name: f.platform, Mode: f.platform}
	}

	return &machine.VersionResponse{Messages: []*machine.Version{v}}, nil
}

func (f *fakeNode) ApplyConfiguration(_ context.Context, req *machine.ApplyConfigurationRequest) (*machine.ApplyConfigurationResponse, error) {
	f.mu.Lock()
	f.apply = req
	f.mu.Unlock()

	return &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{
		Mode:        machine.ApplyConfigurationRequest_NO_REBOOT,
		ModeDetails: "Applied configuration without a reboot",
		Warnings:    []string{"a warning"},
	}}}, nil
}

func (f *fakeNode) imagePull(req *machine.ImageServicePullRequest, srv grpc.ServerStreamingServer[machine.ImageServicePullResponse]) error {
	if !f.imageService {
		return status.Error(codes.Unimplemented, "method Pull not implemented")
	}

	f.mu.Lock()
	f.pulls = append(f.pulls, req)
	f.mu.Unlock()
	f.record("ImageService.Pull " + req.GetImageRef())

	if err := srv.Send(&machine.ImageServicePullResponse{Response: &machine.ImageServicePullResponse_PullProgress{
		PullProgress: &machine.ImageServicePullProgress{LayerId: "sha256:aa"},
	}}); err != nil {
		return err
	}

	return srv.Send(&machine.ImageServicePullResponse{Response: &machine.ImageServicePullResponse_Name{Name: req.GetImageRef() + "@sha256:pulled"}})
}

func (f *fakeNode) ImagePull(_ context.Context, req *machine.ImagePullRequest) (*machine.ImagePullResponse, error) {
	if !f.legacyPull {
		return nil, status.Error(codes.Unimplemented, "method ImagePull not implemented")
	}

	f.record("MachineService.ImagePull " + req.GetNamespace().String() + " " + req.GetReference())

	return &machine.ImagePullResponse{}, nil
}

func (f *fakeNode) Read(req *machine.ReadRequest, srv grpc.ServerStreamingServer[common.Data]) error {
	if req.GetPath() != bootIDPath {
		return status.Errorf(codes.NotFound, "%s", req.GetPath())
	}

	return srv.Send(&common.Data{Bytes: []byte("2c8a5f5e-0000-4000-8000-000000000001\n")})
}

func (f *fakeNode) EtcdMemberList(_ context.Context, req *machine.EtcdMemberListRequest) (*machine.EtcdMemberListResponse, error) {
	if !req.GetQueryLocal() {
		return nil, status.Error(codes.InvalidArgument, "want query_local")
	}

	return &machine.EtcdMemberListResponse{Messages: []*machine.EtcdMembers{{Members: []*machine.EtcdMember{
		{Id: 1, Hostname: "cp-1"},
		{Id: 2, Hostname: "cp-2", IsLearner: true},
	}}}}, nil
}

func (f *fakeNode) Upgrade(ctx context.Context, req *machine.UpgradeRequest) (*machine.UpgradeResponse, error) {
	f.record("MachineService.Upgrade " + req.GetImage())

	return &machine.UpgradeResponse{}, nil
}

func (f *fakeNode) Reboot(context.Context, *machine.RebootRequest) (*machine.RebootResponse, error) {
	f.record("Reboot")

	return &machine.RebootResponse{}, nil
}

func (f *fakeNode) lifecycleUpgrade(req *machine.LifecycleServiceUpgradeRequest, srv grpc.ServerStreamingServer[machine.LifecycleServiceUpgradeResponse]) error {
	if !f.lifecycleService {
		return status.Error(codes.Unimplemented, "method Upgrade not implemented")
	}

	f.record("LifecycleService.Upgrade " + req.GetSource().GetImageName())

	for _, p := range []*machine.LifecycleServiceInstallProgress{
		{Response: &machine.LifecycleServiceInstallProgress_Message{Message: "installing"}},
		{Response: &machine.LifecycleServiceInstallProgress_Message{Message: "writing the boot loader"}},
		{Response: &machine.LifecycleServiceInstallProgress_ExitCode{ExitCode: f.exitCode}},
	} {
		if err := srv.Send(&machine.LifecycleServiceUpgradeResponse{Progress: p}); err != nil {
			return err
		}
	}

	return nil
}

// images serves fakeNode's ImageService.
type images struct {
	machine.UnimplementedImageServiceServer

	node *fakeNode
}

func (i images) Pull(req *machine.ImageServicePullRequest, srv grpc.ServerStreamingServer[machine.ImageServicePullResponse]) error {
	return i.node.imagePull(req, srv)
}

// lifecycle serves fakeNode's LifecycleService (its Upgrade has the name of
// MachineService's).
type lifecycle struct {
	machine.UnimplementedLifecycleServiceServer

	node *fakeNode
}

func (l lifecycle) Upgrade(req *machine.LifecycleServiceUpgradeRequest, srv grpc.ServerStreamingServer[machine.LifecycleServiceUpgradeResponse]) error {
	return l.node.lifecycleUpgrade(req, srv)
}

// serve starts the fake node on a unix socket and returns a Client for it
// (without TLS) and the COSI state the
// node serves.
func serve(t *testing.T, f *fakeNode) (*Client, state.State) {
	t.Helper()

	sock := filepath.Join(t.TempDir(), "talos.sock")

	l, err := net.Listen("unix", sock)
	require.NoError(t, err)

	st := state.WrapCore(namespaced.NewState(inmem.Build))

	srv := grpc.NewServer()
	machine.RegisterMachineServiceServer(srv, f)
	machine.RegisterImageServiceServer(srv, images{node: f})
	machine.RegisterLifecycleServiceServer(srv, lifecycle{node: f})
	cosiapi.RegisterStateServer(srv, cosiserver.NewState(st))

	go srv.Serve(l) //nolint:errcheck // ends with Stop

	t.Cleanup(srv.Stop)

	raw, err := client.New(t.Context(), client.WithUnixSocket(sock),
		client.WithGRPCDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials())))
	require.NoError(t, err)

	c := &Client{c: raw, path: sock}
	t.Cleanup(func() { _ = c.Close() })

	return c, st
}
