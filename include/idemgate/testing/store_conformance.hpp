// SPDX-License-Identifier: MIT
// The store conformance suite: the same behaviours over every store, as a type-parameterised
// GoogleTest suite. A store that passes it is a correct store.
#pragma once

/**
 * @file
 * Run it over a store by writing a traits type (see `store_traits.hpp`) and instantiating the
 * suite with it, in the namespace the suite is defined in. Example:
 *
 *     struct MyStoreTraits : idemgate::testing::OnCommitBusinessRows { ... };
 *     namespace idemgate::testing {
 *     INSTANTIATE_TYPED_TEST_SUITE_P(MyStore, StoreConformance, MyStoreTraits);
 *     }
 *
 * and linking the CMake target `idemgate::testing` (with `GTest::gtest_main`, or a main of your
 * own). Tests are named `MyStore/StoreConformance/0.<Behaviour>`. Stores whose business write
 * runs SQL in the store's transaction also run `SqlStoreConformance`
 * (`sql_store_conformance.hpp`).
 *
 * This header registers the suite; its fixture is `conformance/fixture.hpp` and its tests are in
 * one header per role beside it (`conformance/reservation.hpp`, `conformance/one_transaction.hpp`,
 * ...).
 */

#include "conformance/fixture.hpp"
#include "conformance/gate.hpp"
#include "conformance/gates.hpp"
#include "conformance/leases.hpp"
#include "conformance/one_transaction.hpp"
#include "conformance/operator.hpp"
#include "conformance/reasons.hpp"
#include "conformance/redrive.hpp"
#include "conformance/reservation.hpp"
#include "conformance/retention.hpp"
#include "conformance/signals.hpp"

#include <gtest/gtest.h>

namespace idemgate::testing {

/// @cond
// Every test of the suite, in the order GoogleTest lists and runs them.
REGISTER_TYPED_TEST_SUITE_P(
    StoreConformance, FirstReservationAcquiresWithFenceOne,
    SecondReservationFindsTheKeyInFlightAsTheSameRequest,
    ReservationWithADifferentRequestIsNotTheSameRequest,
    CommitWritesStatusResultAndBusinessRowTogether,
    CommitUnderAStaleFenceLosesTheLeaseAndWritesNothing,
    BusinessWriteThatThrowsCommitsNothingAndLeavesTheRowInFlight,
    RepeatedCommitUnderTheSameFenceIsCommittedWithoutRepeatingTheWrite,
    FailIsFencedAndTheNextReservationSeesTheReason,
    EscalateIsFencedAndTheNextReservationSeesTheReason,
    ReleaseNeedsTheCurrentFenceAndKeepsTheRowInFlight, ReleasedKeyIsTakenOverAtOnceWithTheNextFence,
    ReleasedRowThatNoDeliveryReclaimsIsLeftToTheReconciler,
    RepeatedFailOrEscalateUnderTheSameFenceIsCommitted,
    ExpiredLeaseIsTakenOverWithTheNextFenceLiveLeaseIsNot,
    TakeStaleRespectsLeaseStalenessAndLimitAndBumpsFences, EscalatedListsOldestFirst,
    ResolveCommitsAnEscalatedRowWithItsBusinessWriteOnly,
    EightThreadsReservingOneKeyHaveExactlyOneWinner, SignalsOfAnEmptyStoreAreZeroAndHealthy,
    EveryReservationThatMeetsAnExistingKeyIsCountedOnItsRow,
    SignalsWithoutOneDuplicateInAHundredEventsSuspectTheKeyDerivation,
    SignalsWithTwoPercentDuplicatesAreHealthy,
    SignalsWithAQuarterDuplicatesSayTheUpstreamMisbehaves,
    SignalsShowARowInFlightForElevenMinutesAsStranded,
    SignalsCountAKeyWithTwoResultsAndMismatchesKeepBoth,
    GateRecordsAMismatchWhenALateWorkerHoldsAnotherResult,
    SignalsCountOnlyEventsAndMismatchesInsideTheWindow,
    PurgeRemovesFinishedRowsPastTheWindowAndKeepsTheRest, PurgeDeletesInBatchesAndReturnsTheTotal,
    ExpireDeletesAKeysRowOnlyWhenItsLifeIsOver, PurgeAbandonedDeletesOnlyAttemptsNobodyTouched,
    PurgeNeverRemovesAnInFlightRowUnderConcurrentTraffic,
    GateOverTheStoreTurnsARedeliveryStormIntoOneClaimPerEvent,
    AttemptsStartAtOneAndGrowWithEveryTakeover, RetryingCountsInFlightRowsHeldMoreThanOnce,
    ARedrivenFailedRowIsTakenOverByTheNextReservation, ARedrivenFailedRowIsTakenByTheReconciler,
    RedrivingByTimeTakesFailedRowsInTheRangeUpToTheLimit,
    TwoGatesReservingOneKeyEachHoldTheirOwnRow,
    AGateNeverTakesOverFinishesOrEscalatesAnotherGatesRow,
    QueuesSignalsMismatchesRedrivesAndPurgesSeeOnlyTheirGate,
    AnotherGatesReconcilerNeverFinishesAStrandedRow,
    AdoptingGivesRowsOfNoGateToOneGateExceptKeysItHolds,
    AReservationMeetingARowOfNoGateAnswersFromItAndTakesItOver,
    ABatchReservationMeetingRowsOfNoGateAnswersFromThem,
    RedrivingByKeyLeavesCommittedInFlightAndEscalatedRowsAlone,
    RedrivingByTimeLeavesCommittedInFlightAndEscalatedRowsAlone,
    ARenewalExtendsOnlyTheLeasesWhoseFenceStillHolds, AReleaseWithAHoldKeepsTheKeyUntilTheHoldEnds,
    RowsAndCountFilterByStatusReasonLabelAndTimeNewestFirst,
    CausesGroupTheGatesFailedAndEscalatedRowsByReason,
    ACauseIsTheFirstLineOfAReasonAndFindsEveryRowOfIt,
    RedrivingACauseTakesOnlyItsFailedRowsInTheGateAndKeepsTheReason,
    GatesListsEveryGateWithRowsFromAnyHandle, ALabelIsKeptOnlyWhenGivenAndFindsItsRow,
    HistoryKeepsWhyEveryAttemptEndedThroughRedriveAndResolve, HistoryKeepsTheNewestSixteenEntries,
    AReasonOfAnyBytesIsStoredReadBackAndFoundAgain, ALabelOfAnyBytesIsStoredAndFindsItsRow,
    AGateWhoseDownstreamFailsWithAnyBytesEndsTheAttemptAndReturns,
    OneTransactionCommitsTheRowItsOutcomeAndTheBusinessWriteTogether,
    OneTransactionWhoseWriteThrowsLeavesNeitherRowNorBusinessRow,
    OneTransactionTakesOverAStrandedRowAndAnswersEveryOtherStoredRow,
    SixteenThreadsRunningOneKeyInOneTransactionWriteOnce,
    ADuplicateWaitsForAnOpenTransactionOnlyUpToTheLockTimeout,
    ABatchInOneTransactionEachAnswersEveryMessage);

/// @endcond
}  // namespace idemgate::testing
