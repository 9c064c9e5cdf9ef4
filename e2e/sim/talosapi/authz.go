package talosapi

import (
	"context"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/resource/protobuf"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// rules are the roles allowed per method, copied from Talos' machined rules
// for the methods served here (ImageService and LifecycleService follow
// their MachineService counterparts ImagePull and Upgrade). A method not
// listed needs os:admin, Talos' fallback.
func rules() map[string]role.Set {
	read := role.MakeSet(role.Admin, role.Operator, role.Reader)
	return map[string]role.Set{
		"/machine.MachineService/ApplyConfiguration": role.MakeSet(role.Admin),
		"/machine.MachineService/EtcdMemberList":     role.MakeSet(role.Admin, role.Operator, role.Reader, role.EtcdBackup),
		"/machine.MachineService/ImagePull":          role.MakeSet(role.Admin, role.Operator),
		"/machine.MachineService/Kubeconfig":         role.MakeSet(role.Admin),
		"/machine.MachineService/Read":               role.MakeSet(role.Admin),
		"/machine.MachineService/Reboot":             role.MakeSet(role.Admin, role.Operator),
		"/machine.MachineService/Upgrade":            role.MakeSet(role.Admin),
		"/machine.MachineService/Version":            read,
		"/machine.ImageService/Pull":                 role.MakeSet(role.Admin, role.Operator),
		"/machine.LifecycleService/Upgrade":          role.MakeSet(role.Admin),

		// per-type authorization is done by the COSI state (sensitive types)
		"/cosi.resource.State/Get":   read,
		"/cosi.resource.State/List":  read,
		"/cosi.resource.State/Watch": read,
	}
}

var errNotAuthorized = status.Error(codes.PermissionDenied, "not authorized")

// authorizer checks the caller's roles against the rules.
type authorizer struct {
	rules map[string]role.Set
}

func (a authorizer) check(ctx context.Context, method string) error {
	allowed, ok := a.rules[method]
	if !ok {
		allowed = role.MakeSet(role.Admin)
	}
	p, _ := peer.FromContext(ctx)
	if !rolesFromContext(p).IncludesAny(allowed) {
		return errNotAuthorized
	}
	return nil
}

func (a authorizer) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := a.check(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func (a authorizer) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := a.check(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// checkResourceAccess refuses reading a Sensitive resource type without
// os:admin, as Talos' COSI API does.
func checkResourceAccess(ctx context.Context, typ resource.Type) error {
	r, err := protobuf.CreateResource(typ)
	if err != nil {
		return nil //nolint:nilerr // unknown types hold nothing; the state answers
	}
	rd, ok := r.(meta.ResourceDefinitionProvider)
	if !ok || rd.ResourceDefinition().Sensitivity != meta.Sensitive {
		return nil
	}
	p, _ := peer.FromContext(ctx)
	if !rolesFromContext(p).Includes(role.Admin) {
		return errNotAuthorized
	}
	return nil
}
