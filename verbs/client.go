package verbs

import "github.com/softrdma/softrdma/internal/registry"

// Client is a part of the host's RDMA core that keeps state per device,
// as the kernel's struct ib_client: the SA client, its multicast join
// engine and the IPoIB broadcast membership of an InfiniBand port live in
// one (rdmacm/saclient), not in the provider. A package registers its
// client from init with RegisterClient; every host then calls Add for
// each device it registers and Remove when the device goes. Clients sit
// beside the CM, on verbs' devices: neither providers (which implement
// verbs/driver) nor programs register one, and it stays in verbs because
// its methods take a *Device.
type Client interface {
	// Add is called when dev joins its host's device list, before
	// RegisterDevice returns (the kernel's add_one). It may wait for the
	// device (an SA client asks the subnet's SA here).
	Add(dev *Device)
	// Remove is called when dev leaves its host's device list, before
	// UnregisterDevice returns; it releases what Add made.
	Remove(dev *Device)
}

// ClientInspector is an optional interface of a Client: it adds the
// client's state of a device to the device's report (Device.Inspect),
// e.g. the SA memberships of an InfiniBand port.
type ClientInspector interface {
	// InspectDevice adds the client's state of dev to r.
	InspectDevice(dev *Device, r *DeviceReport)
}

var clients = registry.New[Client]("client")

// RegisterClient adds a client to every host under name: devices
// registered from now on are added to it. Call it from init, before any
// device exists. It panics when name is empty or taken, or c is nil.
func RegisterClient(name string, c Client) { clients.Register(name, c) }

func registeredClients() []Client { return clients.All() }

// ClientData returns what a client stored for the device under key (nil
// when nothing): the kernel's ib_get_client_data.
func (d *Device) ClientData(key any) any {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.clientData[key]
}

// SetClientData stores a client's value for the device under key (nil
// deletes it): the kernel's ib_set_client_data. Keys are the client's
// own unexported types, as with context values.
func (d *Device) SetClientData(key, v any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v == nil {
		delete(d.clientData, key)
		return
	}
	if d.clientData == nil {
		d.clientData = map[any]any{}
	}
	d.clientData[key] = v
}
