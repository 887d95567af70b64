#pragma once

// Runs several threads ("actors") one step at a time: each actor runs until it reaches a hold,
// and the scheduling thread lets exactly one held actor go on at a time. The interleaving is
// then whatever the scheduling thread decides (a seeded random choice replays exactly), while
// every actor runs real code on a real thread against a real store.

#include "fake_terminal.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::test {

/// Thrown in an actor at its next hold once the turnstile stops: not a `std::exception`, so
/// nothing in the library mistakes it for a failure of its own and goes on.
struct Stopped {};

/// Lets one actor thread go on at a time.
class Turnstile {
 public:
  /// An actor held at a point, waiting to be let go.
  struct Held {
    /// The actor, as `spawn` numbered it.
    int actor = 0;
    /// Where it is held.
    std::string at;
  };

  Turnstile() = default;
  Turnstile(const Turnstile&) = delete;
  Turnstile& operator=(const Turnstile&) = delete;
  ~Turnstile() { stop(); }

  /// Starts an actor running `body` on its own thread (it runs until its first hold); returns
  /// its number. `body` ends when it returns or when a hold throws `Stopped`.
  int spawn(std::function<void()> body) {
    std::lock_guard lock(mutex_);
    const int id = static_cast<int>(actors_.size());
    actors_.emplace_back();
    actors_.back().thread = std::thread([this, id, body = std::move(body)] {
      self_ = id;
      try {
        body();
      } catch (const Stopped&) {
      }
      std::lock_guard done(mutex_);
      actors_[static_cast<std::size_t>(id)].done = true;
      changed_.notify_all();
    });
    return id;
  }

  /// In an actor: waits at `at` until the scheduling thread lets it go on. Throws
  /// `SimulatedCrash` when it is let go to crash, and at once while it is dead (see `kill`);
  /// throws `Stopped` once the turnstile stops. Returns at once on a thread that is no actor.
  void hold(std::string at) {
    if (self_ < 0) return;
    std::unique_lock lock(mutex_);
    Actor& me = actors_[static_cast<std::size_t>(self_)];
    if (stopping_) throw Stopped{};
    if (me.dead) throw SimulatedCrash{};
    me.at = std::move(at);
    me.held = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return me.go || stopping_; });
    me.held = false;
    if (stopping_) throw Stopped{};
    me.go = false;
    if (me.crash) {
      me.crash = false;
      me.dead = true;
      throw SimulatedCrash{};
    }
  }

  /// In an actor: it crashed here; every later hold throws `SimulatedCrash` at once, so that it
  /// writes nothing more, until `revive`.
  void kill() {
    if (self_ < 0) return;
    std::lock_guard lock(mutex_);
    actors_[static_cast<std::size_t>(self_)].dead = true;
  }

  /// In an actor: it starts afresh (a restarted process) after a crash.
  void revive() {
    if (self_ < 0) return;
    std::lock_guard lock(mutex_);
    actors_[static_cast<std::size_t>(self_)].dead = false;
  }

  /// In the scheduling thread: waits until every actor is held or has ended, and returns the held
  /// ones. An actor that reaches no hold within `patience` is blocked where no schedule can free
  /// it (a lock held by a held actor): the process aborts, naming where the others are held.
  ///
  /// `parked`, if given, counts the actors that wait on another actor outside any hold right now
  /// (callers of a gate's group commit, waiting for the group another actor leads): the turnstile
  /// settles once every other actor is held or has ended. It must count under one lock, and an
  /// actor it counts must stay parked until a running actor frees it.
  std::vector<Held> settle(std::chrono::seconds patience = std::chrono::seconds(120),
                           const std::function<std::size_t()>& parked = {}) {
    std::unique_lock lock(mutex_);
    const auto settled_now = [&] {
      std::size_t running = 0;
      for (const Actor& a : actors_)
        if (!a.held && !a.done) ++running;
      return running == 0 || (parked && running == parked());
    };
    bool settled = false;
    if (!parked) {
      settled = changed_.wait_for(lock, patience, settled_now);
    } else {
      // Parked actors change no state of the turnstile's: look again every millisecond.
      const auto until = std::chrono::steady_clock::now() + patience;
      while (!(settled = settled_now()) && std::chrono::steady_clock::now() < until)
        changed_.wait_for(lock, std::chrono::milliseconds(1));
    }
    if (!settled) {
      std::fprintf(stderr, "turnstile: an actor reached no hold within %lld s; held:",
                   static_cast<long long>(patience.count()));
      for (std::size_t i = 0; i < actors_.size(); ++i)
        std::fprintf(
            stderr, " [%zu %s]", i,
            actors_[i].held ? actors_[i].at.c_str() : (actors_[i].done ? "ended" : "RUNNING"));
      std::fprintf(stderr, "\n");
      std::abort();
    }
    std::vector<Held> held;
    for (std::size_t i = 0; i < actors_.size(); ++i)
      if (actors_[i].held) held.push_back({static_cast<int>(i), actors_[i].at});
    return held;
  }

  /// In the scheduling thread: lets the held `actor` go on; with `crash`, its hold throws
  /// `SimulatedCrash` instead.
  void let_go(int actor, bool crash = false) {
    std::lock_guard lock(mutex_);
    Actor& a = actors_[static_cast<std::size_t>(actor)];
    a.go = true;
    a.crash = crash;
    a.held = false;
    changed_.notify_all();
  }

  /// Ends every actor at its next hold and joins them.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      changed_.notify_all();
    }
    for (Actor& a : actors_)
      if (a.thread.joinable()) a.thread.join();
  }

 private:
  struct Actor {
    std::thread thread;
    std::string at;
    bool held = false;
    bool go = false;
    bool crash = false;
    bool dead = false;
    bool done = false;
  };

  static inline thread_local int self_ = -1;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Actor> actors_;
  bool stopping_ = false;
};

}  // namespace idemgate::test
