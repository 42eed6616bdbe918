// Command cdi-test-plugin is a test-only Kubernetes device plugin that makes
// the kubelet ask containerd to inject CDI devices: the one way, short of a
// DRA driver or an NRI plugin, that a CDI spec on a node is ever used.
//
// It registers one extended resource with the kubelet and advertises one
// device per id given with -ids. When the kubelet allocates devices to a
// container, the answer names the CDI device <kind>=<id> for each of them;
// the kubelet passes those names in the CRI CreateContainer request and
// containerd injects them from its CDI spec directories (or fails the create
// when it cannot resolve one). The plugin does not read or check the specs:
// that is containerd's part, and what the real-node test looks at.
//
// It serves until SIGTERM or SIGINT, and exits 3 if the kubelet removes its
// socket (a kubelet restart), since it does not register again.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	api.UnimplementedDevicePluginServer
	kind    string
	devices []*api.Device
	stop    chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

// ListAndWatch sends the fixed device list once and holds the stream open:
// closing it would make the kubelet mark every device unhealthy.
func (p *plugin) ListAndWatch(_ *api.Empty, stream api.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&api.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-p.stop:
	case <-stream.Context().Done():
	}
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	resp := &api.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		answer := &api.ContainerAllocateResponse{}
		for _, id := range c.DevicesIds {
			name := p.kind + "=" + id
			answer.CdiDevices = append(answer.CdiDevices, &api.CDIDevice{Name: name})
		}
		log.Printf("allocate %v: CDI devices %v", c.DevicesIds, answer.CdiDevices)
		resp.ContainerResponses = append(resp.ContainerResponses, answer)
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	return &api.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}

func register(pluginDir, socketName, resource string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
		Version:      api.Version,
		Endpoint:     socketName,
		ResourceName: resource,
	})
	return err
}

func main() {
	resource := flag.String("resource", "", "extended resource to register, e.g. cdi-test.vnpu.io/present")
	kind := flag.String("kind", "vnpu.io/vnpu", "CDI kind (vendor/class) of the devices named in Allocate answers")
	ids := flag.String("ids", "", "comma-separated device ids to advertise; each is also the CDI device name")
	pluginDir := flag.String("plugin-dir", api.DevicePluginPath, "the kubelet's device-plugin directory")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if *resource == "" || *ids == "" {
		log.Fatal("-resource and -ids are required")
	}

	p := &plugin{kind: *kind, stop: make(chan struct{})}
	for _, id := range strings.Split(*ids, ",") {
		if id = strings.TrimSpace(id); id != "" {
			p.devices = append(p.devices, &api.Device{ID: id, Health: api.Healthy})
		}
	}
	// One socket per resource, so several plugins can run side by side.
	socketName := "cdi-test-" + strings.NewReplacer("/", "_", ".", "_").Replace(*resource) + ".sock"
	socket := filepath.Join(*pluginDir, socketName)
	_ = os.Remove(socket)
	lis, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("listen on %s: %v", socket, err)
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, p)
	go func() {
		if err := server.Serve(lis); err != nil {
			log.Fatalf("serve: %v", err)
		}
	}()
	if err := register(*pluginDir, socketName, *resource); err != nil {
		log.Fatalf("register %s with the kubelet: %v", *resource, err)
	}
	log.Printf("registered %s with devices %s (CDI kind %s) on %s", *resource, *ids, *kind, socket)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case sig := <-sigs:
			log.Printf("%v: stopping", sig)
			close(p.stop)
			server.Stop()
			_ = os.Remove(socket)
			return
		case <-tick.C:
			if _, err := os.Stat(socket); err != nil {
				fmt.Fprintf(os.Stderr, "socket %s is gone (kubelet restarted?): %v\n", socket, err)
				os.Exit(3)
			}
		}
	}
}
