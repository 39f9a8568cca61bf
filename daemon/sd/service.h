/* SPDX-License-Identifier: MIT */
/*
 * The service manager's side of feedd: readiness and state notifications
 * (sd_notify), the watchdog, and socket activation. Built on libsystemd when
 * the `systemd` meson feature is on; without it notifications and the
 * watchdog are no-ops, and socket activation is read from the environment
 * directly (the protocol is two variables), so feedd behaves the same.
 * Call from the main thread only.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/macro.h"

/*
 * Sends one notification, e.g. "READY=1\nSTATUS=serving". Returns > 0 when
 * sent, 0 when there is no service manager to tell (or no libsystemd), or a
 * negative errno.
 */
int service_notify(const char *state);
int service_notifyf(const char *fmt, ...) _printf_(1, 2);

/* READY=1 with a STATUS= line. */
int service_ready(const char *status);
/* RELOADING=1 with MONOTONIC_USEC=now, as Type=notify-reload expects. */
int service_reloading(void);
int service_stopping(void);
/* STATUS=line, only when it differs from the last one sent. */
int service_status(const char *line);

/* The watchdog interval in microseconds ($WATCHDOG_USEC for this pid), or 0 when off. */
uint64_t service_watchdog_usec(void);
int service_watchdog_ping(void);

/*
 * The listening socket passed by the service manager ($LISTEN_FDS for this
 * pid), made non-blocking and close-on-exec. Returns the fd (>= 3), 0 when
 * none was passed, or a negative errno with a message in err when what was
 * passed is not exactly one listening AF_UNIX stream socket.
 */
int service_listen_fd(char *err, size_t errlen);
