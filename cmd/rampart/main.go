// Command rampart is a host firewall for packet floods.
package main

import "github.com/rampart-fw/rampart/internal/cli"

func main() { cli.Main() }
