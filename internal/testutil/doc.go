// Package testutil holds what rampart's tests share: network-namespace
// helpers and the privilege gate. Frames are built with internal/packet.
package testutil
