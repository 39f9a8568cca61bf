// SPDX-License-Identifier: MIT
// The public header must compile on its own, and as C++.
#include <feed/feed.h>

int main()
{
	feed_client *c = nullptr;
	c = feed_client_close(c);
	return c == nullptr && feed_strerror(0)[0] == 's' ? 0 : 1;
}
